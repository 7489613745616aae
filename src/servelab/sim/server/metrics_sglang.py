"""``/metrics`` in SGLang's dialect, for a simulated server serving an SGLang variant.

Names from ``specs.server_kinds.sglang_log.METRICS`` (SGLang 0.5.21's
observability/metrics_collector.py), so the load generator's scrape, ``servelab verify`` and the
server views read the simulator as they read SGLang. Labels as SGLang writes them: scheduler
series carry model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (and dp_rank under data
parallelism: one scheduler per rank), the tokenizer's counters and histograms model_name and
engine_type, once for the whole server.

Written from the simulator's numbers, with two approximations (assumptions, not SGLang's exact
arithmetic): ``sglang:cache_hit_rate`` is cumulative (SGLang's is the last prefill batch's) and
``sglang:gen_throughput`` is the rate since the previous scrape (SGLang's, since its previous
decode log). The histograms keep the simulator's vLLM buckets. The simulator's own
``servelab:sim_*`` families follow, as with vLLM's dialect.
"""
from __future__ import annotations

import time

from prometheus_client.metrics_core import Metric

from servelab.sim.server.metrics import Hist, SimCollector
from servelab.specs.server_kinds.sglang_log import METRICS


def _merged(hists: list[Hist]) -> Hist:
    out = Hist(hists[0].bounds)
    for h in hists:
        out.counts = [a + b for a, b in zip(out.counts, h.counts)]
        out.sum += h.sum
    return out


class SglangCollector(SimCollector):
    """SGLang's families from the same engines and frontend records as ``SimCollector``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_gen: list[tuple[float, int]] = [(time.monotonic(), 0) for _ in self.engines]

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

    def _tokenizer_hist(self, key: str, doc: str, hists: list[Hist]):
        name, h, base = METRICS[key], _merged(hists), self._tokenizer_labels()
        m = Metric(name, doc, "histogram")
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
        yield from self.sim_families(fe)
