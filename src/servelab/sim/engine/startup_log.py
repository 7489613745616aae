"""vLLM's start-up log for a simulated server, in vLLM's words and order.

``servelab verify`` reads what a server runs from its start-up log: the engine's configuration line
(model, quantization, dtype, speculative config, parallel sizes), the linear kernels vLLM selected
and its warnings, and the KV-cache lines. The simulator prints the same lines, so a simulator log
is verified exactly like a real one.

The version is the vLLM release whose formats these lines follow, tagged ``+servelab.sim`` (a PEP
440 local version) so that nobody mistakes the log for a real server's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from servelab.sim.engine import startup_log_sglang
from servelab.sim.engine.kv_sizing import KVPlan
from servelab.specs.engine_config import EngineConfig

VLLM_FORMAT_VERSION = "0.11.0"
VERSION = f"{VLLM_FORMAT_VERSION}+servelab.sim"

_TORCH_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16",
                 "float": "float32", "float32": "float32"}
_STRUCTURED_OUTPUTS = ("StructuredOutputsConfig(backend='auto', disable_fallback=False, "
                       "disable_any_whitespace=False, disable_additional_properties=False, "
                       "reasoning_parser='')")
_OBSERVABILITY = ("ObservabilityConfig(show_hidden_metrics_for_version=None, "
                  "otlp_traces_endpoint=None, collect_detailed_traces=None)")


def torch_dtype(config: EngineConfig) -> str:
    """``--dtype auto`` takes the checkpoint's ``torch_dtype`` (float32 checkpoints run in bf16)."""
    requested = config.serve_args.dtype
    if requested in _TORCH_DTYPES:
        return _TORCH_DTYPES[requested]
    dtype = config.model.torch_dtype or "bfloat16"
    return "bfloat16" if dtype == "float32" else dtype


def speculative_repr(config: EngineConfig) -> str:
    """vLLM's ``SpeculativeConfig.__repr__``: method, draft model (None for n-gram), k."""
    spec = config.speculative
    if spec is None:
        return "None"
    model = spec.raw.get("model")
    model = "None" if spec.method == "ngram" or not model else repr(model)
    return (f"SpeculativeConfig(method={spec.method!r}, model={model}, "
            f"num_spec_tokens={spec.num_speculative_tokens})")


def engine_config_line(config: EngineConfig, seed: int = 0) -> str:
    """``Initializing a V1 LLM engine (v...) with config: ...``: VllmConfig.__str__'s fields."""
    args = config.serve_args
    model = config.model.hf_id
    names = config.served_model_names
    served = names[0] if len(names) == 1 else repr(list(names))
    eager = config.enforce_eager
    compilation = ('{"level":0,"use_cudagraph":false,"cudagraph_mode":0}' if eager else
                   '{"level":3,"use_cudagraph":true,"cudagraph_mode":[2,1],"max_capture_size":512}')
    fields = [
        f"model={model!r}", f"speculative_config={speculative_repr(config)}",
        f"tokenizer={model!r}", "skip_tokenizer_init=False", "tokenizer_mode=auto",
        "revision=None", "tokenizer_revision=None",
        f"trust_remote_code={'--trust-remote-code' in args.ignored}",
        f"dtype=torch.{torch_dtype(config)}", f"max_seq_len={config.max_model_len}",
        "download_dir=None", "load_format=auto",
        f"tensor_parallel_size={config.tensor_parallel_size}", "pipeline_parallel_size=1",
        f"data_parallel_size={config.data_parallel_size}",
        f"disable_custom_all_reduce={args.disable_custom_all_reduce}",
        f"quantization={config.quant.method}", f"enforce_eager={eager}",
        f"kv_cache_dtype={config.kv_cache_dtype}", "device_config=cuda",
        f"structured_outputs_config={_STRUCTURED_OUTPUTS}",
        f"observability_config={_OBSERVABILITY}", f"seed={seed}",
        f"served_model_name={served}",
        f"enable_prefix_caching={config.enable_prefix_caching}",
        "chunked_prefill_enabled=True", "pooler_config=None",
        f"compilation_config={compilation}",
    ]
    return f"Initializing a V1 LLM engine (v{VERSION}) with config: {', '.join(fields)}"


def startup_lines(config: EngineConfig, plan: KVPlan, seed: int = 0) -> list[str]:
    """The API server's version and max-model-len lines, the engine's config line, then the
    kernel choices, warnings and KV-cache lines (``plan.log_lines``); warnings start "WARNING "."""
    return [f"vLLM API server version {VERSION}",
            f"Using max model len {config.max_model_len}",
            engine_config_line(config, seed),
            *plan.log_lines]


def format_line(line: str, now: float | None = None) -> str:
    """A line as ``servelab sim`` prints it, with vLLM's ``LEVEL MM-DD HH:MM:SS [file]`` prefix
    (a "WARNING " at the start of ``line`` sets the level)."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
    if line.startswith("WARNING "):
        return f"WARNING {stamp} [servelab.sim] {line[8:]}"
    return f"INFO {stamp} [servelab.sim] {line}"


@dataclass(frozen=True)
class LogDialect:
    """How the simulator's log reads for one server kind (``EngineConfig.server_kind``)."""
    startup_lines: Callable      # (config, plan, seed) -> lines
    format_line: Callable        # (line) -> the printed line
    ready_line: str | None       # printed once the server listens (None: vLLM prints none)


DIALECTS = {"vllm": LogDialect(startup_lines, format_line, None),
            "sglang": LogDialect(startup_log_sglang.startup_lines,
                                 startup_log_sglang.format_line, startup_log_sglang.READY_LINE)}


def dialect(config: EngineConfig) -> LogDialect:
    return DIALECTS[config.server_kind]
