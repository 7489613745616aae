"""vLLM's start-up log for a simulated server, in the words and order of a chosen vLLM release.

``servelab verify`` reads what a server runs from its start-up log: the engine's configuration line
(model, quantization, dtype, speculative config, parallel sizes), the linear kernels vLLM selected
and its warnings, and the KV-cache lines. The simulator prints the same lines, so a simulator log
is verified exactly like a real one.

The release (``servelab sim --vllm-version``, default ``vllm_versions.CURRENT``) picks the row of
``specs.server_kinds.vllm.versions`` whose wording the lines follow: the banner, the KV capacity
line(s), the linear-method names, the engine's quantization name. The engine's decisions
(``EngineConfig.log_lines``, ``KVPlan.log_lines``) are written in the oldest row's words and
re-worded here. The version is tagged ``+servelab.sim`` (a PEP 440 local version) so that nobody
mistakes the log for a real server's.
"""
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from servelab.core.errors import ServelabError
from servelab.specs.server_kinds.vllm import versions as vllm_versions

if TYPE_CHECKING:  # the simulator hands these in; the kind does not depend on it
    from servelab.sim.engine.kv_sizing import KVPlan
    from servelab.specs.engine_config import EngineConfig

VLLM_FORMAT_VERSION = vllm_versions.CURRENT
VERSION = f"{VLLM_FORMAT_VERSION}+servelab.sim"
_OLD = vllm_versions.RELEASES[0]   # the wording EngineConfig and KVPlan write their lines in
_KV_SIZE = re.compile(r"^GPU KV cache size: ([\d,]+) tokens$")
_MAX_CONC = re.compile(r"^Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x$")
_CONVERTIBLE = "The model is convertible to "
_KERNEL_LINE = re.compile(r"^(Using|Selected) (\w+Kernel) for (\w+)$")
_LOADING = re.compile(r"^Model loading took ([\d.]+) GiB and ([\d.]+) seconds$")


def imitated(version: str | None) -> str:
    """The version string the simulator reports for ``--vllm-version`` (None: the current)."""
    version = version or VLLM_FORMAT_VERSION
    if vllm_versions.parse_version(version) is None:
        raise ServelabError(f"--vllm-version {version}: not a vLLM version; give one such as "
                            f"{vllm_versions.CURRENT} (ranges: "
                            + ", ".join(r.since for r in vllm_versions.RELEASES) + ")")
    return version.split("+", 1)[0] + "+servelab.sim"

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


def engine_config_line(config: EngineConfig, seed: int = 0, version: str | None = None) -> str:
    """``Initializing a V1 LLM engine (v...) with config: ...``: VllmConfig.__str__'s fields."""
    shown = imitated(version)
    row = vllm_versions.release(shown)
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
        f"quantization={_quantization_name(config, row)}", f"enforce_eager={eager}",
        f"kv_cache_dtype={config.kv_cache_dtype}", "device_config=cuda",
        f"structured_outputs_config={_STRUCTURED_OUTPUTS}",
        f"observability_config={_OBSERVABILITY}", f"seed={seed}",
        f"served_model_name={served}",
        f"enable_prefix_caching={config.enable_prefix_caching}",
        "chunked_prefill_enabled=True", "pooler_config=None",
        f"compilation_config={compilation}",
    ]
    return f"Initializing a V1 LLM engine (v{shown}) with config: {', '.join(fields)}"


def _quantization_name(config: EngineConfig, row) -> str | None:
    """The engine line's quantization=: 0.26+ names a GPTQ/AWQ checkpoint's Marlin path
    auto_gptq/auto_awq (AutoGPTQConfig.get_name); a forced slow kernel keeps its name."""
    method = config.quant.method
    ckpt = config.model.quant_method
    if method in (f"{ckpt}_marlin",) and ckpt in row.engine_quantization:
        return row.engine_quantization[ckpt]
    return method


def _reword(line: str, config: EngineConfig, row) -> list[str]:
    """One of the engine's decision lines (written in the oldest row's words) in ``row``'s."""
    if row is _OLD:
        return [line]
    if line.startswith(_CONVERTIBLE) and not row.marlin_conversion_line:
        return []
    if (m := _LOADING.match(line)) is not None:
        return [row.loading_line.format(gib=m.group(1), s=m.group(2))]
    m = _KERNEL_LINE.match(line)
    if m:
        verb, kernel, method = m.groups()
        for key, old in _OLD.linear_methods.items():
            if method != old:
                continue
            if key == "fp8" and config.model.quant_method is not None:
                break  # an FP8 checkpoint keeps Fp8LinearMethod; only online quantization differs
            # the kernel is the engine's own choice (engine_config.w4a16_kernels: Machete on
            # compute capability 9.0, as vLLM's choose_mp_linear_kernel); only words change here
            return [f"{verb} {kernel} for {row.linear_methods[key]}"]
    return [line]


def _kv_lines(lines: list[str], row) -> list[str]:
    """The engine's two KV capacity lines in ``row``'s format (0.28+ joins them)."""
    out, size = [], None
    for line in lines:
        if (m := _KV_SIZE.match(line)) is not None:
            size = int(m.group(1).replace(",", ""))
            continue
        if (m := _MAX_CONC.match(line)) is not None and size is not None:
            out += [t.format(tokens=size, max_len=int(m.group(1).replace(",", "")),
                             conc=float(m.group(2))) for t in row.kv_cache_lines]
            size = None
            continue
        out.append(line)
    return out


def startup_lines(config: EngineConfig, plan: KVPlan, seed: int = 0,
                  version: str | None = None) -> list[str]:
    """The API server's banner and max-model-len lines, the scheduler's lines, the engine's
    config line, then the kernel choices, warnings and KV-cache lines (``plan.log_lines``), in
    the words of ``version``'s release; warnings start "WARNING "."""
    shown = imitated(version)
    row = vllm_versions.release(shown)
    decisions = [out for line in plan.log_lines for out in _reword(line, config, row)]
    head = [row.banner.format(version=shown, model=config.model.hf_id),
            f"Using max model len {config.max_model_len}"]
    if row is not _OLD:  # 0.26+ logs the scheduler's choices on the API server, before the engine
        chunked = [line for line in decisions if line.startswith("Chunked prefill is enabled")]
        decisions = [line for line in decisions if line not in chunked]
        method = config.speculative.method if config.speculative else None
        state = "disabled" if method in row.async_off_for else "enabled"
        head += chunked + [f"Asynchronous scheduling is {state}."]
    return [*head, engine_config_line(config, seed, shown), *_kv_lines(decisions, row)]


def format_line(line: str, now: float | None = None) -> str:
    """A line as ``servelab sim`` prints it, with vLLM's ``LEVEL MM-DD HH:MM:SS [file]`` prefix
    (a "WARNING " at the start of ``line`` sets the level)."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
    if line.startswith("WARNING "):
        return f"WARNING {stamp} [servelab.sim] {line[8:]}"
    return f"INFO {stamp} [servelab.sim] {line}"
