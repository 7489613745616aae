"""SGLang's start-up log for a simulated server serving an SGLang variant, in SGLang's words.

``servelab verify`` reads an SGLang log with ``specs.server_kinds.sglang.log``; the simulator
writes the lines that grammar reads, in the order and wording of SGLang 0.5.21's source
(entrypoints/engine.py ``server_args=``, model_executor/model_runner.py ``Load weight end.``,
mem_cache/memory_pool.py ``KV Cache is allocated.``, managers/scheduler.py
``max_total_num_tokens=``, entrypoints/http_server.py's ready line) with SGLang's
``[YYYY-MM-DD HH:MM:SS] message`` prefix (utils/common.py configure_logger). Warnings carry no
level, as SGLang's format has none. The sizes are the simulator's memory plan, not a GPU's.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from servelab.specs.server_kinds.sglang import log as sglang_log

if TYPE_CHECKING:  # the simulator hands these in; the kind does not depend on it
    from servelab.sim.engine.kv_sizing import KVPlan
    from servelab.specs.engine_config import EngineConfig

READY_LINE = sglang_log.READY_LINE
MAX_PREFILL_TOKENS = 16384  # arg_groups/fields/schedule.py --max-prefill-tokens default
# The attention backend SGLang picks for a dense model (attention_hook.py): FlashAttention 3 on
# Hopper, FlashInfer elsewhere. An assumption where a GPU is neither; it changes no timing here.
_FA3_FROM_CC = 90


def _server_args(config: EngineConfig, seed: int) -> dict:
    spec = config.speculative
    algorithm = None
    if spec is not None:
        algorithm = {v: k for k, v in sglang_log.SPEC_ALGORITHMS.items()}.get(spec.method,
                                                                             spec.method.upper())
    cc = config.hardware.cc_number
    model = config.model.hf_id
    return {
        "model_path": model, "tokenizer_path": model, "load_format": "auto",
        "context_length": config.max_model_len, "dtype": "auto",
        "quantization": config.quant.method, "kv_cache_dtype": config.kv_cache_dtype,
        "mem_fraction_static": config.gpu_memory_utilization,
        "max_running_requests": config.max_num_seqs,
        "chunked_prefill_size": config.max_num_batched_tokens,
        "max_prefill_tokens": MAX_PREFILL_TOKENS, "schedule_policy": config.schedule_policy,
        "enable_mixed_chunk": config.mixed_prefill_decode,
        "page_size": config.block_size,
        "tp_size": config.tensor_parallel_size, "pp_size": 1,
        "dp_size": config.data_parallel_size, "served_model_name": config.served_model_name,
        "attention_backend": "fa3" if cc >= _FA3_FROM_CC else "flashinfer",
        "disable_radix_cache": not config.enable_prefix_caching,
        "speculative_algorithm": algorithm,
        "speculative_num_draft_tokens": spec.num_speculative_tokens if spec else None,
        "speculative_num_steps": spec.num_speculative_tokens if spec else None,
        "enable_metrics": True, "random_seed": seed,
    }


def startup_lines(config: EngineConfig, plan: KVPlan, seed: int = 0) -> list[str]:
    """server_args, weights, the FP8 fallback warning if any, the KV pool and the scheduler's
    totals; the ready line comes once the server listens (``READY_LINE``)."""
    lines = [f"server_args={_server_args(config, seed)!r}"]
    if plan.errors:
        return lines
    arch = (config.model.config.get("architectures") or ["ForCausalLM"])[0]
    quant = f"quant={config.quant.method}, " if config.quant.method else ""
    avail = plan.gpu_memory_gib - plan.non_torch_gib
    lines.append(f"Load weight end. elapsed={plan.load_time_s:.2f} s, type={arch}, {quant}"
                 f"avail mem={avail:.2f} GB, mem usage={plan.weights_gib:.2f} GB.")
    lines += list(config.warnings)
    dtype = "torch.float8_e4m3fn" if config.kv_cache_dtype.startswith("fp8") else (
        "torch.float16" if config.model.torch_dtype == "float16" else "torch.bfloat16")
    half = plan.kv_tokens * plan.kv_bytes_per_token / 2 / 2**30
    lines.append(f"KV Cache is allocated. dtype: {dtype}, #tokens: {plan.kv_tokens}, "
                 f"K size: {half:.2f} GB, V size: {half:.2f} GB")
    left = avail - plan.weights_gib - plan.available_kv_gib
    lines.append(f"max_total_num_tokens={plan.kv_tokens}, chunked_prefill_size="
                 f"{config.max_num_batched_tokens}, max_prefill_tokens={MAX_PREFILL_TOKENS}, "
                 f"max_running_requests={config.max_num_seqs}, context_len="
                 f"{config.max_model_len}, available_gpu_mem={max(left, 0.0):.2f} GB")
    return lines


def format_line(line: str, now: float | None = None) -> str:
    """A line as SGLang prints it: ``[2026-10-01 09:00:00] message``."""
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}] {line}"
