"""``/metrics``: vLLM's Prometheus names, types, labels and buckets, plus the simulator's own lag.

Names and buckets follow vLLM's V1 ``loggers.py`` (``../shared/reference/vllm_behaviour.md``
section 1). The hot path only bumps plain numbers (a histogram observation is one bisect); a
custom collector turns them into metric families when ``/metrics`` is scraped, through the server's
own ``CollectorRegistry``.

Where each value comes from, as in vLLM:
- the engine (``engine.stats``, read at scrape): running/waiting, KV usage, preemptions, prefix
  cache queries and hits, speculative decoding counters;
- the engine's step (per step): ``iteration_tokens_total``;
- the frontend (this server, at delivery): prompt/generation token counters, request success,
  TTFT/ITL/E2E (from arrival to delivery), and per request queue/prefill/decode/inference times
  from the engine's scheduling timestamps.

``http_requests_total{handler,method,status}`` counts requests per route as vLLM's
prometheus_fastapi_instrumentator does (status as "2xx", "4xx", ...; /metrics, /health, /ping,
/version not counted).

The simulator adds ``servelab:sim_lag_seconds`` (gauge, last step) and
``servelab:sim_lag_max_seconds``, the histogram ``servelab:sim_step_lag_seconds`` (how late each
step's tokens were delivered against the engine's schedule), ``servelab:sim_delivery_seconds`` (time
spent writing one step's chunks) and counters ``servelab:sim_steps_total`` and
``servelab:sim_lag_resyncs_total`` (times the schedule was re-anchored because lag passed
``resync_after_s``). A p99 lag above a millisecond or two means the simulator, not the simulated
GPU, is shaping the timings.
"""
from __future__ import annotations

import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from servelab.sim.engine.kv_offload import LMCACHE_COUNTERS, LOAD, SIZE_BUCKETS, STORE
from servelab.sim.server.metric_families import (ENGINE_FAMILIES, FRONTEND_HISTOGRAMS, SIM_FAMILIES,
                                                 SPEC_DECODE_COUNTERS)
from servelab.sim.server.metrics_versions import VersionedCollector

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
LAG_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
               1.0, 2.5)
FINISHED_REASONS = ("stop", "length", "abort")


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class Hist:
    """A Prometheus histogram as plain numbers: per-bucket counts (last one is +Inf) and a sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self):
        acc = 0
        for bound, c in zip(self.bounds, self.counts):
            acc += c
            yield floatToGoString(bound), acc
        yield "+Inf", acc + self.counts[-1]


class EngineMetrics:
    """What the frontend records for one engine (one ``engine`` label value)."""

    def __init__(self, max_model_len: int):
        tokens = buckets_1_2_5(max_model_len)
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.tpot = Hist(ITL_BUCKETS)
        self.e2e = Hist(REQUEST_LATENCY_BUCKETS)
        self.queue = Hist(REQUEST_LATENCY_BUCKETS)
        self.inference = Hist(REQUEST_LATENCY_BUCKETS)
        self.prefill = Hist(REQUEST_LATENCY_BUCKETS)
        self.decode = Hist(REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens_hist = Hist(tokens)
        self.generation_tokens_hist = Hist(tokens)
        self.params_max_tokens = Hist(tokens)
        self.max_num_generation_tokens = Hist(tokens)
        self.prefill_kv_computed = Hist(tokens)
        self.params_n = Hist(PARAMS_N_BUCKETS)
        self.iteration_tokens = Hist(ITERATION_TOKENS_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0   # prompt tokens of finished requests served from the cache
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        # the simulator's own health
        self.lag = Hist(LAG_BUCKETS)
        self.delivery = Hist(LAG_BUCKETS)
        self.lag_last = 0.0
        self.lag_max = 0.0
        self.steps = 0
        self.resyncs = 0

    def observe_finished(self, *, arrival: float, first_token: float | None, last_token: float,
                         num_prompt: int, num_output: int, num_cached: int, max_tokens: int,
                         reason: str, scheduled: float | None, engine_first_token: float | None,
                         engine_last_token: float | None) -> None:
        """One finished request, as vLLM's output processor records it. Times in seconds on one
        clock; ``scheduled`` / ``engine_*`` are the engine's timestamps (None if never run)."""
        self.success[reason] = self.success.get(reason, 0) + 1
        self.prompt_tokens_hist.observe(num_prompt)
        self.generation_tokens_hist.observe(num_output)
        self.params_max_tokens.observe(max_tokens)
        self.max_num_generation_tokens.observe(max_tokens)
        self.params_n.observe(1)
        self.cached_tokens += max(num_cached, 0)
        self.e2e.observe(last_token - arrival)
        if scheduled is None or engine_first_token is None:
            return
        self.prefill_kv_computed.observe(max(num_prompt - max(num_cached, 0), 0))
        self.queue.observe(max(scheduled - arrival, 0.0))
        self.prefill.observe(engine_first_token - scheduled)
        end = engine_last_token if engine_last_token is not None else engine_first_token
        decode = end - engine_first_token
        self.decode.observe(decode)
        self.inference.observe(end - scheduled)
        if num_output > 1:
            self.tpot.observe(decode / (num_output - 1))


class SimCollector(Collector):
    """Builds the metric families from the engines' stats and the frontend's records."""

    def __init__(self, model_name: str, engines, frontend: list[EngineMetrics],
                 cache_info: dict[str, str], spec_k: int,
                 http_requests: dict[tuple[str, str, str], int] | None = None):
        self.model_name = model_name
        self.engines = engines
        self.frontend = frontend
        self.cache_info = cache_info
        self.spec_k = spec_k
        self.http_requests = {} if http_requests is None else http_requests
        self.created = time.time()
        # Set by a server kind that writes its own /metrics (ServerKind.sim_metrics): its labels
        # go on every family, the servelab:sim_* ones included.
        self.engine_labels = None

    def _base(self, i: int) -> dict:
        if self.engine_labels is not None:
            return self.engine_labels(i)
        return {"model_name": self.model_name, "engine": str(i)}

    def _gauge(self, name, doc, values):
        m = Metric(name, doc, "gauge")
        for i, v in enumerate(values):
            m.add_sample(name, self._base(i), float(v))
        return m

    def _counter(self, name, doc, values, extra=None):
        """``values[i]`` is a number, or a dict {label value: number} for the ``extra`` label."""
        m = Metric(name, doc, "counter")
        for i, v in enumerate(values):
            items = v.items() if extra else [(None, v)]
            for key, value in items:
                labels = self._base(i)
                if extra:
                    labels[extra] = str(key)
                m.add_sample(name + "_total", labels, float(value))
                m.add_sample(name + "_created", labels, self.created)
        return m

    def _hist(self, name, doc, hists):
        m = Metric(name, doc, "histogram")
        for i, h in enumerate(hists):
            base = self._base(i)
            for le, count in h.cumulative():
                m.add_sample(name + "_bucket", {**base, "le": le}, float(count))
            m.add_sample(name + "_count", base, float(h.count))
            m.add_sample(name + "_sum", base, h.sum)
            m.add_sample(name + "_created", base, self.created)
        return m

    def collect(self):
        stats = [e.stats for e in self.engines]
        yield from self._families(ENGINE_FAMILIES, stats)
        yield from self._frontend_families(self.frontend)
        yield self._cache_config_info(stats)
        if any(getattr(e, "offload", None) is not None for e in self.engines):
            yield from self.offload_families()
        if self.spec_k:
            yield from self._spec_decode_families(stats)
        yield self._http_family()
        yield from self.sim_families(self.frontend)

    def _families(self, table, rows):
        """One family per ``(type, name, help, attribute)`` of ``table``: each engine's
        ``row.attribute`` its sample."""
        make = {"gauge": self._gauge, "counter": self._counter, "histogram": self._hist}
        for kind, name, doc, attr in table:
            yield make[kind](name, doc, [getattr(r, attr) for r in rows])

    def _frontend_families(self, fe):
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                            [f.prompt_tokens for f in fe])
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            [f.generation_tokens for f in fe])
        yield self._counter("vllm:request_success", "Count of successfully processed requests.",
                            [f.success for f in fe], extra="finished_reason")
        for name, doc, attr in FRONTEND_HISTOGRAMS:
            yield self._hist(name, doc, [getattr(f, attr) for f in fe])

    def _cache_config_info(self, stats):
        info = Metric("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
        for i, s in enumerate(stats):
            info.add_sample("vllm:cache_config_info",
                            {**self.cache_info, "num_gpu_blocks": str(s.num_gpu_blocks),
                             **self._offload_info(self.engines[i]), "engine": str(i)}, 1.0)
        return info

    def _spec_decode_families(self, stats):
        yield from self._families(SPEC_DECODE_COUNTERS, stats)
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
            [{p: (s.spec_accepted_per_pos_total[p] if p < len(s.spec_accepted_per_pos_total)
                  else 0) for p in range(self.spec_k)} for s in stats], extra="position")

    def _http_family(self):
        http = Metric("http_requests", "Total number of requests by method, status and handler.",
                      "counter")
        for (handler, method, status), count in sorted(self.http_requests.items()):
            labels = {"handler": handler, "method": method, "status": status}
            http.add_sample("http_requests_total", labels, float(count))
            http.add_sample("http_requests_created", labels, self.created)
        return http

    @staticmethod
    def _offload_info(engine) -> dict:
        """vLLM 0.26's cache_config_info labels for offloading (its capture: backend "native",
        size "None" when off)."""
        tier = getattr(engine, "offload", None)
        size = (engine.config.kv_offload_bytes / (1 << 30)
                if tier is not None and engine.config.kv_offload_bytes else None)
        return {"kv_offloading_backend": engine.config.kv_offload_backend,
                "kv_offloading_size": str(size),
                **({"num_cpu_blocks": str(tier.num_blocks)} if tier is not None else {})}

    def offload_families(self):
        """What vLLM exposes with the OffloadingConnector (v1/metrics/loggers.py and the
        connector's OffloadPromMetrics): the connector's prefix-cache queries and hits (tokens)
        and, per transfer_type (CPU_to_GPU loads, GPU_to_CPU stores), bytes, seconds and a
        histogram of transfer sizes. An engine without a tier reports zeros."""
        tiers = [getattr(e, "offload", None) for e in self.engines]
        yield self._counter("vllm:external_prefix_cache_queries",
                            "External prefix cache queries from KV connector cross-instance cache "
                            "sharing, in terms of number of queried tokens.",
                            [t.queries if t else 0 for t in tiers])
        yield self._counter("vllm:external_prefix_cache_hits",
                            "External prefix cache hits from KV connector cross-instance cache "
                            "sharing, in terms of number of cached tokens.",
                            [t.hits if t else 0 for t in tiers])
        if any(getattr(t, "counts", None) is not None for t in tiers):
            # LMCacheConnectorV1: LMCache's own lmcache:* families (lmcache/observability.py,
            # labels model_name and worker_id, the TP rank: rank 0's here), not kv_offload_*.
            for key in LMCACHE_COUNTERS:
                m = Metric(f"lmcache:num_{key}", f"LMCache {key.replace('_', ' ')}", "counter")
                for i, t in enumerate(tiers):
                    labels = {**self._base(i), "worker_id": "0"}
                    m.add_sample(f"lmcache:num_{key}_total", labels,
                                 float(t.counts[key] if t else 0))
                yield m
            yield self._gauge("lmcache:local_cache_usage", "Local cache usage (bytes) of lmcache",
                              [len(t.ready_at) * t.link.transfer_bytes(t.block_size)
                               if t else 0 for t in tiers])
            return
        kinds = (LOAD, STORE)
        yield self._counter("vllm:kv_offload_total_bytes", "Number of bytes offloaded by KV "
                            "connector", [{k: t.dirs[k].bytes if t else 0 for k in kinds}
                                          for t in tiers], extra="transfer_type")
        yield self._counter("vllm:kv_offload_total_time", "Total time measured by all KV "
                            "offloading operations", [{k: t.dirs[k].time_s if t else 0
                                                       for k in kinds} for t in tiers],
                            extra="transfer_type")
        m = Metric("vllm:kv_offload_size", "Histogram of KV offload transfer size, in bytes.",
                   "histogram")
        for i, t in enumerate(tiers):
            for k in kinds:
                base = {**self._base(i), "transfer_type": k}
                h = Hist(SIZE_BUCKETS)
                if t is not None:
                    h.counts, h.sum = list(t.dirs[k].size_counts), t.dirs[k].size_sum
                for le, count in h.cumulative():
                    m.add_sample("vllm:kv_offload_size_bucket", {**base, "le": le}, float(count))
                m.add_sample("vllm:kv_offload_size_count", base, float(h.count))
                m.add_sample("vllm:kv_offload_size_sum", base, h.sum)
        yield m

    def sim_families(self, fe):
        """The simulator's own health families, whatever dialect the server speaks."""
        yield from self._families(SIM_FAMILIES, fe)


class MetricsExporter:
    """The server's own registry: vLLM's families (every one the imitated release defines:
    ``metrics_versions``) plus process and GC metrics, as vLLM has."""

    def __init__(self, collector: SimCollector, vllm_version: str | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.versioned = VersionedCollector(collector, vllm_version)
        self.registry.register(self.versioned)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def imitate(self, vllm_version: str) -> None:
        """Expose the families of this vLLM release (``servelab sim --vllm-version``)."""
        self.versioned.version = vllm_version

    def render(self) -> bytes:
        return generate_latest(self.registry)
