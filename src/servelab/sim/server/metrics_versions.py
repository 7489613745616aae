"""The rest of a vLLM release's ``/metrics`` names, beyond the families ``metrics.SimCollector``
models: what makes the simulator's page carry every family the imitated release defines.

Two kinds, from the release's vendored name list (``specs.server_kinds.vllm.versions``):
- modelled here from the engines' and frontend's numbers: prompt tokens by source and cached
  (0.26+), cached prompt tokens by the tier that supplied them and admission rejections (0.33:
  the simulator has no queue limit, so its rejections are truly 0);
- declared only: families whose feature the simulator does not run (KV-transfer connectors,
  HiSparse, sleep mode, RL weight updates, watermarking, LoRA, diffusion drafts, per-request
  preemption counts the engine does not hand the frontend). They go out as HELP and TYPE with no
  series, which is how a Prometheus client shows a labelled family none of whose label sets has
  been touched yet; a series would claim a measurement the simulator did not make.
"""
from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from servelab.specs.server_kinds.vllm import versions as vllm_versions

ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")   # v1/metrics/loggers.py
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")  # CacheHitSource


def _modelled(collector, defined: dict):
    """The families this module fills with numbers, those the release defines."""
    fe = collector.frontend
    tiers = [getattr(e, "offload", None) for e in collector.engines]
    stats = [e.stats for e in collector.engines]
    if "vllm:prompt_tokens_by_source" in defined:
        # Counted per finished request: computed here, served from the local prefix cache.
        yield collector._counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
            [{"local_compute": max(f.prompt_tokens_hist.sum - f.cached_tokens, 0),
              "local_cache_hit": f.cached_tokens, "external_kv_transfer": 0} for f in fe],
            extra="source")
    if "vllm:prompt_tokens_cached" in defined:
        yield collector._counter("vllm:prompt_tokens_cached",
                                 "Number of cached prompt tokens (local + external).",
                                 [f.cached_tokens for f in fe])
    if "vllm:prompt_tokens_cached_by_source" in defined:
        # 0.33: sums to prefix_cache_hits + external_prefix_cache_hits; the CPU tier is "host".
        yield collector._counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them.",
            [{"device": s.prefix_cache_hits_total, "host": t.hits if t else 0, "p2p": 0,
              "disk": 0, "external_unspecified": 0} for s, t in zip(stats, tiers)],
            extra="source")
    if "vllm:admission_rejections" in defined:
        m = Metric("vllm:admission_rejections",
                   "Number of admission attempts rejected by a queue limit, by reason.", "counter")
        for reason in ADMISSION_REASONS:
            labels = {"model_name": collector.model_name, "reason": reason}
            m.add_sample("vllm:admission_rejections_total", labels, 0.0)
            m.add_sample("vllm:admission_rejections_created", labels, collector.created)
        yield m


class VersionedCollector(Collector):
    """A simulator collector's families, then what the imitated release adds (above). A page
    with no ``vllm:`` family (SGLang's dialect) is left as it is."""

    def __init__(self, inner, version: str | None = None):
        self.inner = inner
        self.version = version or vllm_versions.CURRENT

    def collect(self):
        seen: set[str] = set()
        for family in self.inner.collect():
            seen.add(family.name)
            yield family
        if not any(name.startswith("vllm:") for name in seen):
            return
        defined = vllm_versions.metric_names(self.version)
        for family in _modelled(self.inner, defined):
            if family.name not in seen:
                seen.add(family.name)
                yield family
        for name, entry in sorted(defined.items()):
            kind = entry["type"]
            family = vllm_versions.exposed_family(name, kind)
            if family in seen:
                continue
            seen.add(family)
            yield Metric(family, f"Defined by vLLM {self.version} ({entry['file']}); the "
                         "simulator does not run what fills it, so it has no series.", kind)
