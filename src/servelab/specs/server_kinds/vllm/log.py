"""vLLM's start-up log and Prometheus ``/metrics``, read into ``ServerFacts``.

The log says which linear kernel vLLM selected (native FP8, FP8 weight-only through Marlin, W4A16
Marlin or a slow forced kernel), the quantization method in the engine's config, the speculative
config, the parallel sizes and the KV-cache size. ``/metrics`` confirms the cache config
(``vllm:cache_config_info``), the engines (one per data-parallel rank) and whether speculative
decoding counters exist. Wording varies by vLLM version; the patterns accept the known variants.
"""
from __future__ import annotations

import ast
import re

from servelab.specs.server_kinds.kind import ERROR_LINE, FP8_MARLIN_WARNING, LinearPath, ServerFacts
from servelab.specs.server_kinds.kind import view_metrics

CUSTOM_AR_WARNING = "Custom allreduce is disabled because your platform lacks GPU P2P capability"

# Canonical name -> what vLLM's /metrics calls it. The server-timeline SQL views and verify read
# these; vLLM before 0.9 named the cache gauge gpu_cache_usage_perc (kv_cache_usage_legacy).
METRICS = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "kv_cache_usage_legacy": "vllm:gpu_cache_usage_perc",
    "preemptions": "vllm:num_preemptions_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "cache_config": "vllm:cache_config_info",
    # The OffloadingConnector's CPU tier (--kv-offloading-size): tokens asked of it and found in
    # it, and bytes moved, one series per transfer_type (CPU_to_GPU loads, GPU_to_CPU stores).
    "offload_queries": "vllm:external_prefix_cache_queries_total",
    "offload_hits": "vllm:external_prefix_cache_hits_total",
    "offload_bytes": "vllm:kv_offload_total_bytes_total",
}
# The server views read every counter above (kind.VIEW_KEYS names which feeds which).
VIEW_METRICS = view_metrics(METRICS)
# Linear-layer kernels that run 4-bit weights with 16-bit activations (W4A16).
INT4_KERNELS = ("MarlinLinearKernel", "MacheteLinearKernel", "AllSparkLinearKernel",
                "ConchLinearKernel", "ExllamaLinearKernel", "BitBLASLinearKernel",
                "CutlassW4A8LinearKernel", "Dynamic4bitLinearKernel")

_KERNEL = re.compile(r"\b(?:Selected|Using) (\w+Kernel) for ([\w{},/ ]+?)\s*$")
_CONVERTIBLE = re.compile(r"The model is convertible to (\w+) during runtime\. Using (\w+) kernel")
_FORCED = re.compile(r"Detected that the model can run with (\w+), however you specified "
                     r"quantization=(\w+) explicitly, so forcing (\w+)")
_ENGINE = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v?([^)]+)\) with config: (.*)$")
# The API server's version: "vLLM API server version X" (before 0.26), "vLLM server version X,
# serving model M" (0.26+, logo off) or the logo's "█ ▀▄▀ █  version X" (0.26+, the default).
_API_VERSION = re.compile(r"(?:vLLM (?:API )?server version|▀▄▀ █\s+version) (\S+?),?(?:\s|$)")
_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_LOADING = re.compile(r"Model loading took ([\d.]+) GiB")
_CHUNKED = re.compile(r"max_num_batched_tokens=(\d+)")
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_SPEC_OBJ = re.compile(r"SpeculativeConfig\((.*?)\)")
# vLLM's wrapper around a dead engine core; the root cause is logged before it.
_WRAPPER = ("Engine core initialization failed", "See root cause above")
# Data-parallel engine cores log as (EngineCore_DP0 pid=...), each its own config line.
_DP_RANK = re.compile(r"^\(EngineCore_(?:DP)?(\d+)\b")
_PREFIX = re.compile(r"^(?:\(\w+(?: rank=\d+)? pid=\d+\)\s*)?"
                     r"(?:(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+(?:\.\d+)? "
                     r"\[[^\]]*\]\s*)?")


def _message(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1)


def parse_log(text: str, facts: ServerFacts | None = None) -> ServerFacts:
    facts = facts or ServerFacts()
    dp_ranks: set[str] = set()
    dp_seen: list[int] = []
    started = stopping = False   # errors after start-up are not why a start failed
    for raw in text.splitlines():
        msg = _message(raw)
        if not msg:
            continue
        if m := _DP_RANK.match(raw):
            dp_ranks.add(m.group(1))
        if m := _KERNEL.search(msg):
            entry = f"{m.group(1)} for {m.group(2).strip()}"
            if entry not in facts.kernels:
                facts.kernels.append(entry)
        if m := _CONVERTIBLE.search(msg):
            facts.marlin_conversion = m.group(2)
        if m := _FORCED.search(msg):
            facts.forced_quantization = m.group(3)
        if FP8_MARLIN_WARNING in msg:
            facts.fp8_marlin_fallback = True
        if CUSTOM_AR_WARNING in msg:
            facts.custom_allreduce_disabled = True
        if m := _API_VERSION.search(msg):
            facts.vllm_version = facts.vllm_version or m.group(1)
        if m := _ENGINE.search(msg):
            facts.vllm_version = m.group(1)
            _engine_config(m.group(2), facts)
            if facts.data_parallel_size is not None:
                dp_seen.append(facts.data_parallel_size)
        if m := _NON_DEFAULT.search(msg):
            _non_default_args(m.group(1), facts)
            if facts.data_parallel_size is not None:
                dp_seen.append(facts.data_parallel_size)
        if m := _KV_TOKENS.search(msg):
            facts.kv_cache_tokens = int(m.group(1).replace(",", ""))
        if m := _MAX_CONC.search(msg):
            facts.max_concurrency_len = int(m.group(1).replace(",", ""))
            facts.max_concurrency = float(m.group(2))
        if m := _AVAILABLE.search(msg):
            facts.available_kv_gib = float(m.group(1))
        if m := _LOADING.search(msg):
            facts.model_weights_gib = float(m.group(1))
        if "Chunked prefill is enabled" in msg and (m := _CHUNKED.search(msg)):
            facts.max_num_batched_tokens = int(m.group(1))
        if "Application startup complete" in msg:
            started = True
        if "[shutdown]" in msg:
            stopping = True  # vLLM 0.26 aborts its engine on SIGTERM and logs EngineDeadError
        if (m := ERROR_LINE.search(msg)) and not stopping:
            found = facts.runtime_errors if started else facts.errors
            if m.group(1) not in found:
                found.append(m.group(1))
    # Each DP engine prints data_parallel_size=1 in its own config line; the deployment's size is
    # the API server's argument or the number of engine ranks, whichever is larger.
    if dp_seen or len(dp_ranks) > 1:
        facts.data_parallel_size = max(dp_seen + [len(dp_ranks)])
    # The root cause first: vLLM's "Engine core initialization failed" only wraps it.
    facts.errors.sort(key=lambda e: any(w in e for w in _WRAPPER))
    return facts


def _config_value(config: str, key: str) -> str | None:
    # Values are "key=value, " pairs; quoted values may hold commas, nested objects parentheses.
    m = re.search(rf"(?:^|, ){re.escape(key)}=('[^']*'|[^,]*)", config)
    return m.group(1).strip("'") if m else None


def _engine_config(config: str, facts: ServerFacts) -> None:
    facts.engine_config_seen = True
    facts.model = _config_value(config, "model") or facts.model
    quant = _config_value(config, "quantization")
    if quant is not None:
        facts.quantization = None if quant == "None" else quant
    facts.dtype = _config_value(config, "dtype") or facts.dtype
    for key, attr in (("tensor_parallel_size", "tensor_parallel_size"),
                      ("data_parallel_size", "data_parallel_size")):
        value = _config_value(config, key)
        if value and value.isdigit():
            setattr(facts, attr, int(value))
    if re.search(r"(?:^|, )speculative_config=None\b", config):
        facts.speculative_seen = True
        facts.speculative = None
    elif m := _SPEC_OBJ.search(config):
        facts.speculative_seen = True
        facts.speculative = _spec_from_repr(m.group(1))


def _spec_from_repr(body: str) -> dict:
    spec: dict = {}
    for key, value in re.findall(r"(\w+)=('[^']*'|[^,]*)", body):
        value = value.strip().strip("'")
        if key == "method":
            spec["method"] = value
        elif key in ("num_spec_tokens", "num_speculative_tokens") and value.isdigit():
            spec["num_speculative_tokens"] = int(value)
        elif key in ("model", "draft_model") and value not in ("None", ""):
            spec["model"] = value
    if "method" not in spec and "model" in spec:
        spec["method"] = "draft_model"
    return spec


def _non_default_args(text: str, facts: ServerFacts) -> None:
    try:
        args = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return
    if not isinstance(args, dict):
        return
    facts.model = facts.model or args.get("model") or args.get("model_tag")
    if "quantization" in args and facts.quantization is None:
        facts.quantization = args["quantization"]
    for key in ("tensor_parallel_size", "data_parallel_size"):
        if isinstance(args.get(key), int) and getattr(facts, key) is None:
            setattr(facts, key, args[key])
    spec = args.get("speculative_config")
    if isinstance(spec, dict) and not facts.speculative_seen:
        facts.speculative_seen = True
        facts.speculative = {k: spec[k] for k in ("method", "model", "num_speculative_tokens")
                             if k in spec}


def parse_metrics(text: str, facts: ServerFacts | None = None) -> ServerFacts:
    """Read what ``/metrics`` confirms: cache config, engines, speculative counters."""
    from prometheus_client.parser import text_string_to_metric_families

    facts = facts or ServerFacts()
    facts.metrics_seen = True
    engines: set[str] = set(facts.engines)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "engine" in sample.labels:
                engines.add(sample.labels["engine"])
            if sample.name.startswith(METRICS["cache_config"]):
                # One per engine on a data-parallel server; the first describes each engine.
                facts.cache_configs.append(dict(sample.labels))
                facts.cache_config = facts.cache_config or dict(sample.labels)
            if sample.name.startswith(METRICS["spec_drafts"].removesuffix("_total")):
                facts.spec_decode_metrics = True
            if "model_name" in sample.labels and facts.metric_model_name is None:
                facts.metric_model_name = sample.labels["model_name"]
    facts.engines = sorted(engines, key=lambda e: (len(e), e))
    if facts.cache_config and facts.kv_cache_tokens is None:
        try:
            facts.kv_cache_tokens = (int(facts.cache_config["num_gpu_blocks"])
                                     * int(facts.cache_config.get("block_size", 16)))
        except (KeyError, ValueError):
            pass
    return facts


def linear_path(facts: ServerFacts) -> LinearPath:
    """vLLM's kernel lines and warnings, read as which precision the linear layers really run."""
    kernels = " ".join(facts.kernels)
    return LinearPath(
        fp8_native=any("FP8ScaledMM" in k and "Marlin" not in k for k in facts.kernels),
        fp8_weight_only=facts.fp8_marlin_fallback or "MarlinFP8" in kernels,
        int4=bool(facts.marlin_conversion)
        or any(k.split(" ")[0] in INT4_KERNELS for k in facts.kernels))
