"""SGLang's start-up log and Prometheus ``/metrics``, read into ``ServerFacts``.

Read from SGLang's own source, release 0.5.21 (the PyPI wheel sglang-0.5.21, the version the
Compose image ``lmsysorg/sglang:v0.5.21`` ships):
  - entrypoints/engine.py: ``server_args={...}``, the resolved arguments as a Python dict (model,
    tp_size, dp_size, quantization, dtype, speculative_*, attention_backend, ...);
  - model_executor/model_runner.py: ``Load weight end. elapsed=.. s, type=.., [quant=.., ]avail
    mem=.. GB, mem usage=.. GB.`` (a ``dtype=..`` there, as older releases wrote, is read too);
  - mem_cache/memory_pool.py: ``KV Cache is allocated. dtype: torch.bfloat16, #tokens: N, K size:
    .. GB, V size: .. GB`` (or ``KV size: .. GB``);
  - managers/scheduler.py: ``max_total_num_tokens=N, chunked_prefill_size=.., max_prefill_tokens=..,
    max_running_requests=.., context_len=.., available_gpu_mem=.. GB``;
  - layers/quantization/marlin_utils_fp8.py: the warning when FP8 runs weight-only through Marlin
    (compute capability 8.0-8.8: fp8_utils.can_auto_enable_marlin_fp8), the same words as vLLM's;
  - entrypoints/http_server.py: ``The server is fired up and ready to roll!`` once warm-up ended;
  - utils/common.py configure_logger: lines look like ``[2026-10-01 06:36:00 DP0 TP0] message``;
  - observability/metrics_collector.py: the ``sglang:*`` names below. Scheduler series carry
    model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (and dp_rank under data parallelism);
    the tokenizer's counters carry model_name, engine_type (and is_streaming / cache_source).
The metric names were cross-checked against sgl-project/sglang at commit 00ae9c1590d2
(python/sglang/srt/metrics/collector.py, the module's older home): the same names.
"""
from __future__ import annotations

import re

from servelab.specs.server_kinds.kind import ERROR_LINE, FP8_MARLIN_WARNING, LinearPath, ServerFacts
from servelab.specs.server_kinds.kind import view_metrics

READY_LINE = "The server is fired up and ready to roll!"

# Canonical name -> what SGLang's /metrics calls it (the keys are vllm_log.METRICS's). SGLang
# counts the prefix cache as cached prompt tokens, so the "queries" of the hit rate are its prompt
# tokens (sglang:cache_hit_rate is the same ratio per batch); it retracts where vLLM preempts.
METRICS = {
    "running": "sglang:num_running_reqs",
    "waiting": "sglang:num_queue_reqs",
    "kv_cache_usage": "sglang:token_usage",
    "preemptions": "sglang:num_retracted_requests_total",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    "prefix_cache_queries": "sglang:prompt_tokens_total",
    "prefix_cache_hits": "sglang:cached_tokens_total",
    "spec_drafts": "sglang:spec_verify_calls_total",
    "spec_accept_length": "sglang:spec_accept_length",
    "kv_pool_tokens": "sglang:max_total_num_tokens",
    "cache_hit_rate": "sglang:cache_hit_rate",
    "gen_throughput": "sglang:gen_throughput",
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e_latency": "sglang:e2e_request_latency_seconds",
}
# The server views' names -> METRICS. SGLang has no per-draft counters (spec_verify_calls counts
# verify steps), so the views' spec_* stay NULL for it (sglang:spec_accept_length is its gauge).
VIEW_METRICS = view_metrics(METRICS, without=("spec_drafts",))
# SGLang's --speculative-algorithm -> the method names claims use (vLLM's words). NEXTN is
# DeepSeek's multi-token prediction; STANDALONE a separate draft model.
SPEC_ALGORITHMS = {"NGRAM": "ngram", "EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp",
                   "STANDALONE": "draft_model"}

_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?((?: [A-Z_]+\d+)*)\] ?")
_DP_TAG = re.compile(r"\bDP(\d+)\b")
_SERVER_ARGS = re.compile(r"server_args=(\{.*\}|ServerArgs\(.*\))\s*$")
_LOAD = re.compile(r"Load weight end\.(.*)$")
_MEM_USAGE = re.compile(r"mem usage=([\d.]+) GB")
_KV_POOL = re.compile(r"KV Cache is allocated\.(?: dtype: ([\w.]+),)? #tokens: (\d+), "
                      r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")
_TOTALS = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+)")
_STOPPING = ("Shutting down", "Received sigquit", "Finished server process")
# `python3 -m sglang.launch_server` where sglang is not installed: Python's own message.
_NO_MODULE = re.compile(r"\(?(ModuleNotFoundError: No module named '[\w.]+')\)?")


def _message(line: str) -> tuple[str, str]:
    line = line.rstrip("\r\n")
    m = _PREFIX.match(line)
    return (line[m.end():], m.group(1)) if m else (line, "")


def _arg(text: str, key: str):
    """One top-level value of the server_args line: a dict repr (0.5.x) or a dataclass repr
    (older releases); values that are not plain literals (enums, nested objects) are skipped."""
    m = re.search(rf"(?:'{key}': |\b{key}=)('(?:[^'\\]|\\.)*'|None|True|False|-?\d+(?:\.\d+)?)",
                  text)
    if m is None:
        return None
    value = m.group(1)
    if value.startswith("'"):
        return value[1:-1]
    if value in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[value]
    return float(value) if "." in value else int(value)


def _server_args(text: str, facts: ServerFacts) -> None:
    facts.engine_config_seen = True
    facts.model = _arg(text, "model_path") or _arg(text, "served_model_name") or facts.model
    quant = _arg(text, "quantization")
    facts.quantization = quant if quant not in (None, "None") else None
    dtype = _arg(text, "dtype")
    if isinstance(dtype, str) and dtype != "auto":
        facts.dtype = dtype
    for key, attr in (("tp_size", "tensor_parallel_size"), ("dp_size", "data_parallel_size")):
        value = _arg(text, key)
        if isinstance(value, int):
            setattr(facts, attr, value)
    backend = _arg(text, "attention_backend")
    if isinstance(backend, str):
        facts.attention_backend = backend
    chunked = _arg(text, "chunked_prefill_size")
    if isinstance(chunked, int) and chunked > 0:
        facts.max_num_batched_tokens = chunked
    facts.speculative_seen = True
    algorithm = _arg(text, "speculative_algorithm")
    if algorithm in (None, "None"):
        facts.speculative = None
        return
    method = SPEC_ALGORITHMS.get(str(algorithm).upper(), str(algorithm).lower())
    facts.speculative = {"method": method}
    k = _arg(text, "speculative_num_draft_tokens" if method == "ngram" else
             "speculative_num_steps")
    if isinstance(k, int):
        facts.speculative["num_speculative_tokens"] = k
    draft = _arg(text, "speculative_draft_model_path")
    if isinstance(draft, str):
        facts.speculative["model"] = draft


def parse_log(text: str, facts: ServerFacts | None = None) -> ServerFacts:
    facts = facts or ServerFacts()
    dp_ranks: set[str] = set()
    stopping = False
    for raw in text.splitlines():
        msg, tags = _message(raw)
        if not msg:
            continue
        if m := _DP_TAG.search(tags):
            dp_ranks.add(m.group(1))
        if m := _SERVER_ARGS.search(msg):
            _server_args(m.group(1), facts)
        if m := _LOAD.search(msg):
            load = m.group(1)
            if d := re.search(r"dtype=([\w.]+)", load):
                facts.dtype = d.group(1)
            if q := re.search(r"quant=([\w-]+)", load):
                facts.quantization = facts.quantization or q.group(1)
            if u := _MEM_USAGE.search(load):
                facts.model_weights_gib = float(u.group(1))
        if m := _KV_POOL.search(msg):
            facts.kv_cache_dtype = m.group(1) or facts.kv_cache_dtype
            facts.kv_cache_tokens = int(m.group(2))
            sizes = [float(g) for g in m.groups()[2:] if g is not None]
            facts.available_kv_gib = round(sum(sizes), 2)
        if m := _TOTALS.search(msg):
            facts.kv_cache_tokens = int(m.group(1))
            if int(m.group(2)) > 0:
                facts.max_num_batched_tokens = int(m.group(2))
        if FP8_MARLIN_WARNING in msg:
            facts.fp8_marlin_fallback = True
        if READY_LINE in msg:
            facts.startup_complete = True
        if any(s in msg for s in _STOPPING):
            stopping = True
        if (m := ERROR_LINE.search(msg) or _NO_MODULE.search(msg)) and not stopping:
            found = facts.runtime_errors if facts.startup_complete else facts.errors
            if m.group(1) not in found:
                found.append(m.group(1))
    if len(dp_ranks) > 1:
        facts.data_parallel_size = max(facts.data_parallel_size or 1, len(dp_ranks))
    # SGLang names no GEMM kernel; verify reads kernels, so the evidence is written as one.
    quant, entry = facts.quantization, None
    if quant in FP8_W8A8 and facts.startup_complete and not facts.fp8_marlin_fallback:
        # The Marlin warning is logged while weights load, so a complete start-up log without
        # it means Fp8LinearMethod kept FP8 activations.
        entry = (f"Fp8LinearMethod W8A8 (quantization={quant}, no Marlin fallback warning "
                 f"before the server was ready)")
    elif quant in INT4_METHODS:
        entry = f"{quant} W4A16 (quantization={quant})"
    if entry and entry not in facts.kernels:
        facts.kernels.append(entry)
    return facts


# --quantization values whose linear layers run FP8 x FP8 on GPUs with native FP8.
FP8_W8A8 = ("fp8", "w8a8_fp8", "modelopt_fp8")
INT4_METHODS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "moe_wna16")


def parse_metrics(text: str, facts: ServerFacts | None = None) -> ServerFacts:
    """What ``/metrics`` confirms: the model name, the engines (DP ranks), the KV pool size and
    whether speculative decoding verified anything."""
    from prometheus_client.parser import text_string_to_metric_families

    facts = facts or ServerFacts()
    facts.metrics_seen = True
    engines: set[str] = set(facts.engines)
    scheduler_seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == METRICS["running"]:
                scheduler_seen = True
                engines.add(labels.get("dp_rank", "0"))
            if sample.name == METRICS["kv_pool_tokens"] and facts.kv_cache_tokens is None:
                facts.kv_cache_tokens = int(sample.value)
            if sample.name in (METRICS["spec_drafts"], METRICS["spec_accept_length"]) \
                    and sample.value > 0:
                facts.spec_decode_metrics = True
            if "model_name" in labels and facts.metric_model_name is None:
                facts.metric_model_name = labels["model_name"]
    if scheduler_seen:
        facts.engines = sorted(engines, key=lambda e: (len(e), e))
    return facts


def linear_path(facts: ServerFacts) -> LinearPath:
    quant = facts.quantization or ""
    return LinearPath(
        fp8_native=any(k.startswith("Fp8LinearMethod W8A8") for k in facts.kernels),
        fp8_weight_only=facts.fp8_marlin_fallback,
        int4=quant in INT4_METHODS)
