"""``/metrics`` in SGLang's dialect, for a simulated server serving an SGLang variant.

Names from ``specs.server_kinds.sglang.log.METRICS`` (SGLang 0.5.21's
observability/metrics_collector.py), so the load generator's scrape, ``servelab verify`` and the
server views read the simulator as they read SGLang. Labels as SGLang writes them: scheduler
series carry model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (and dp_rank under data
parallelism: one scheduler per rank), the tokenizer's counters and histograms model_name and
engine_type, once for the whole server.

Written from the simulator's numbers, with two approximations (assumptions, not SGLang's exact
arithmetic): ``sglang:cache_hit_rate`` is cumulative (SGLang's is the last prefill batch's) and
``sglang:gen_throughput`` is the rate since the previous scrape (SGLang's, since its previous
decode log). The histograms keep the simulator's vLLM buckets, and ``sglang:queue_time_seconds``
and ``sglang:per_stage_req_latency_seconds{stage="prefill_forward"}`` are observed when a request
finishes (vLLM's moment; SGLang observes each when the phase ends). The simulator's own
``servelab:sim_*`` families follow, as with vLLM's dialect.

The simulator hands its own collector in (``sim``: engines, frontend records, the ``servelab:sim_*``
families); nothing here imports the simulator, so the kind stays below its layer.
"""
from __future__ import annotations

import time

from prometheus_client.metrics_core import Metric

from servelab.specs.server_kinds.sglang.log import METRICS


def _merged(hists: list):
    """One histogram of the same bounds holding every engine's observations."""
    out = type(hists[0])(hists[0].bounds)
    for h in hists:
        out.counts = [a + b for a, b in zip(out.counts, h.counts)]
        out.sum += h.sum
    return out


class SglangMetrics:
    """SGLang's families from the simulator collector's engines and frontend records."""

    def __init__(self, sim):
        self.sim = sim
        self.model_name, self.engines, self.frontend = sim.model_name, sim.engines, sim.frontend
        self.spec_k, self.created = sim.spec_k, sim.created
        self._last_gen: list[tuple[float, int]] = [(time.monotonic(), 0) for _ in self.engines]
        # SGLang's labels on every family, the simulator's own servelab:sim_* ones included.
        sim.engine_labels = self._base
        self._gauge, self._counter, self._hist = sim._gauge, sim._counter, sim._hist

    def _base(self, i: int) -> dict:
        labels = {"model_name": self.model_name, "engine_type": "unified", "tp_rank": "0",
                  "pp_rank": "0", "moe_ep_rank": "0"}
        if len(self.engines) > 1:
            labels["dp_rank"] = str(i)
        return labels

    def _tokenizer_labels(self) -> dict:
        return {"model_name": self.model_name, "engine_type": "unified"}

    def _gen_throughput(self, stats) -> list[float]:
        now, rates = time.monotonic(), []
        for i, s in enumerate(stats):
            t0, g0 = self._last_gen[i]
            rates.append((s.generation_tokens_total - g0) / (now - t0) if now > t0 else 0.0)
            self._last_gen[i] = (now, s.generation_tokens_total)
        return rates

    def _tokenizer_counter(self, exposed: str, doc: str, value: float,
                           extra: dict | None = None):
        name = exposed.removesuffix("_total")
        m = Metric(name, doc, "counter")
        labels = {**self._tokenizer_labels(), **(extra or {})}
        m.add_sample(name + "_total", labels, float(value))
        m.add_sample(name + "_created", labels, self.created)
        return m

    def _tokenizer_hist(self, key: str, doc: str, hists: list):
        name, h, base = METRICS[key], _merged(hists), self._tokenizer_labels()
        m = Metric(name, doc, "histogram")
        for le, count in h.cumulative():
            m.add_sample(name + "_bucket", {**base, "le": le}, float(count))
        m.add_sample(name + "_count", base, float(h.count))
        m.add_sample(name + "_sum", base, h.sum)
        return m

    def _stage_hist(self, stages: dict[str, list]):
        """``sglang:per_stage_req_latency_seconds{stage=...}``, per scheduler (SGLang 0.5.23,
        observability/req_time_stats.py: the stages whose metrics_is_observed is set)."""
        name = "sglang:per_stage_req_latency_seconds"
        m = Metric(name, "The latency of each stage of requests.", "histogram")
        for stage, hists in stages.items():
            for i, h in enumerate(hists):
                base = {**self._base(i), "stage": stage}
                for le, count in h.cumulative():
                    m.add_sample(name + "_bucket", {**base, "le": le}, float(count))
                m.add_sample(name + "_count", base, float(h.count))
                m.add_sample(name + "_sum", base, h.sum)
        return m

    def collect(self):
        stats = [e.stats for e in self.engines]
        fe = self.frontend
        yield self._gauge(METRICS["running"], "The number of running requests.",
                          [s.num_running for s in stats])
        yield self._gauge(METRICS["waiting"], "The number of requests in the waiting queue.",
                          [s.num_waiting for s in stats])
        yield self._gauge(METRICS["kv_cache_usage"], "The token usage.",
                          [s.kv_usage for s in stats])
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.",
                          [round(s.kv_usage * e.kv_plan.kv_tokens)
                           for s, e in zip(stats, self.engines)])
        yield self._gauge(METRICS["kv_pool_tokens"], "Maximum total number of tokens in the "
                          "KV cache pool.", [e.kv_plan.kv_tokens for e in self.engines])
        yield self._gauge(METRICS["cache_hit_rate"], "The prefix cache hit rate.",
                          [s.prefix_cache_hits_total / s.prefix_cache_queries_total
                           if s.prefix_cache_queries_total else 0.0 for s in stats])
        yield self._gauge(METRICS["gen_throughput"], "The generation throughput (token/s).",
                          self._gen_throughput(stats))
        retracted = METRICS["preemptions"].removesuffix("_total")
        yield self._counter(retracted, "Number of retracted requests.",
                            [s.num_preemptions_total for s in stats])
        yield self._tokenizer_counter(METRICS["prompt_tokens"], "Number of prefill tokens "
                                      "processed.",
                                      sum(f.prompt_tokens for f in fe))
        yield self._tokenizer_counter(METRICS["generation_tokens"], "Number of generation tokens "
                                      "processed.", sum(f.generation_tokens for f in fe))
        yield self._tokenizer_counter(METRICS["prefix_cache_hits"], "Number of cached prompt "
                                      "tokens.",
                                      sum(s.prefix_cache_hits_total for s in stats),
                                      {"cache_source": "device"})
        yield self._tokenizer_counter("sglang:num_requests_total", "Number of requests processed.",
                                      sum(sum(f.success.values()) for f in fe))
        for key, doc, attr in (("ttft", "Histogram of time to first token in seconds.", "ttft"),
                               ("itl", "Histogram of inter-token latency in seconds.", "itl"),
                               ("e2e_latency", "Histogram of End-to-end request latency in "
                                "seconds", "e2e")):
            yield self._tokenizer_hist(key, doc, [getattr(f, attr) for f in fe])
        if self.spec_k:
            yield self._counter(METRICS["spec_drafts"].removesuffix("_total"),
                                "Number of speculative verify calls.",
                                [s.spec_num_drafts_total for s in stats])
            yield self._gauge(METRICS["spec_accept_length"], "The average acceptance length.",
                              [1 + s.spec_num_accepted_tokens_total / s.spec_num_drafts_total
                               if s.spec_num_drafts_total else 0.0 for s in stats])
        # the scheduler's per-request stages: waiting -> first forward, first forward -> prefill
        # done (what vLLM's span calls time_in_queue and time_in_model_prefill)
        yield self._hist("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                         [f.queue for f in fe])
        yield self._stage_hist({"prefill_forward": [f.prefill for f in fe]})
        yield from self.sim.sim_families(fe)
