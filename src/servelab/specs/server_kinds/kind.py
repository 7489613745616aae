"""What servelab needs to know about one kind of LLM server (vLLM, SGLang).

A ``ServerKind`` is plain data plus the few functions that differ between frameworks: how its
command line is spelled, which flags carry the settings servelab reasons about, how its start-up
log and ``/metrics`` are read, and how the simulator imitates them (``SimDialect``). Backends,
Compose generation, preflight, verify and the simulator ask the variant's kind instead of assuming
vLLM, so adding a framework is one new package under ``server_kinds/``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class ServerFacts:
    """What a server's log and ``/metrics`` showed; ``None`` / empty where they said nothing.

    Field names are vLLM's where vLLM coined the concept; another kind's grammar fills the same
    fields so verify judges every kind by one set of rules."""

    vllm_version: str | None = None
    model: str | None = None
    engine_config_seen: bool = False         # vLLM's "Initializing a V1 LLM engine" line
    quantization: str | None = None          # from the engine config line (None: unquantized)
    dtype: str | None = None
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    speculative: dict | None = None          # {"method": ..., "num_speculative_tokens": ...}
    speculative_seen: bool = False           # the log stated the speculative config (None or not)
    kernels: list[str] = field(default_factory=list)   # "CutlassFP8ScaledMMLinearKernel for ..."
    marlin_conversion: str | None = None     # gptq_marlin / awq_marlin chosen at runtime
    forced_quantization: str | None = None   # slow kernel forced by an explicit --quantization
    fp8_marlin_fallback: bool = False
    custom_allreduce_disabled: bool = False
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    available_kv_gib: float | None = None
    model_weights_gib: float | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None        # SGLang's KV pool line ("torch.bfloat16")
    attention_backend: str | None = None     # SGLang's resolved server_args
    startup_complete: bool = False           # the log reached the kind's "ready" line
    errors: list[str] = field(default_factory=list)           # before start-up completed
    runtime_errors: list[str] = field(default_factory=list)   # while serving (not shutdown)
    # from /metrics
    metrics_seen: bool = False
    cache_config: dict | None = None              # the first engine's vllm:cache_config_info
    cache_configs: list[dict] = field(default_factory=list)   # one per engine (DP)
    engines: list[str] = field(default_factory=list)
    spec_decode_metrics: bool = False
    metric_model_name: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class LinearPath:
    """Which linear-layer path the evidence shows (a kind's kernel names, read into three facts)."""
    fp8_native: bool        # W8A8 on FP8 tensor cores
    fp8_weight_only: bool   # FP8 weights, 16-bit activations (vLLM: Marlin W8A16)
    int4: bool              # 4-bit weights, 16-bit activations


# The server views' canonical names (analysis/38_server_metric_names.sql: gauges as they are,
# counters ending _total) -> the canonical key of a kind's METRICS that feeds each.
VIEW_KEYS = (
    ("running", "running"), ("waiting", "waiting"), ("kv_usage", "kv_cache_usage"),
    ("kv_usage_legacy", "kv_cache_usage_legacy"), ("preemptions_total", "preemptions"),
    ("prompt_tokens_total", "prompt_tokens"), ("generation_tokens_total", "generation_tokens"),
    ("prefix_cache_queries_total", "prefix_cache_queries"),
    ("prefix_cache_hits_total", "prefix_cache_hits"), ("spec_drafts_total", "spec_drafts"),
    ("spec_draft_tokens_total", "spec_draft_tokens"),
    ("spec_accepted_tokens_total", "spec_accepted_tokens"),
    ("offload_queries_total", "offload_queries"), ("offload_hits_total", "offload_hits"),
    ("offload_bytes_total", "offload_bytes"))


def view_metrics(metrics: dict[str, str], without: tuple[str, ...] = ()) -> dict[str, str]:
    """A kind's ``view_metrics``: each view name whose key its ``metrics`` has, less the keys in
    ``without`` (a counter whose meaning differs from the view's)."""
    return {view: metrics[key] for view, key in VIEW_KEYS if key in metrics and key not in without}


# How vLLM's log starts the warning that FP8 weights run weight-only through Marlin (no native
# FP8 on the GPU); SGLang logs the same words.
FP8_MARLIN_WARNING = "Your GPU does not have native support for FP8 computation"
# A traceback's last line: the exception (any *Error or *Exception: ModuleNotFoundError,
# ValueError, torch.OutOfMemoryError ...) at the start of a log message, not quoted inside a
# warning. Every kind's log grammar reads start-up and runtime errors with it.
ERROR_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception): .*)$")
HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# A local model folder as `vllm serve` takes it: absolute, ./ ../ or ~ relative.
MODEL_PATH_RE = re.compile(r"^(?:/|\./|\.\./|~/?)\S*$")


def parse_flags(args, aliases: dict[str, str], next_flag: str = "-") -> dict[str, str | bool]:
    """``['--tp', '2', '--enable-metrics', '--x=1']`` -> {'--tp-size': '2', '--enable-metrics':
    True, '--x': '1'}: a flag takes the next token as its value unless that token starts with
    ``next_flag`` (vLLM: any dash; SGLang: ``--``, so ``-1`` is a value); aliases become the long
    spelling and underscores dashes."""
    parsed: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        flag = aliases.get(flag, flag).replace("_", "-") if flag.startswith("-") else flag
        if eq:
            parsed[flag] = value
        elif i + 1 < len(args) and not args[i + 1].startswith(next_flag):
            parsed[flag] = args[i + 1]
            i += 1
        else:
            parsed[flag] = True
        i += 1
    return parsed


def is_model_ref(text) -> bool:
    """An HF id (``org/name``) or a local folder path, the two forms a server's model takes."""
    return isinstance(text, str) and bool(HF_ID_RE.match(text) or MODEL_PATH_RE.match(text))

# Claims name speculative methods in vLLM's words; another kind's adapter maps its own onto these.
SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp",
                       "suffix")

# Concepts a variant's serve_args may set, each spelled by the kind's own flag (ServerKind.flags).
FLAG_CONCEPTS = ("model", "host", "port", "tensor_parallel_size", "pipeline_parallel_size",
                 "data_parallel_size", "quantization", "max_model_len", "memory_utilization",
                 "speculative_config")


@dataclass(frozen=True)
class SimDialect:
    """How the simulator's start-up log reads for a kind. Pure text from the engine's config and
    memory plan (passed in, never imported), so the kind stays below the simulator's layer."""
    startup_lines: Callable      # (config, plan, seed, version) -> lines
    format_line: Callable        # (line) -> the printed line, with the kind's prefix
    ready_line: str | None       # printed once the server listens (None: vLLM prints none)


@dataclass(frozen=True)
class ServerKind:
    name: str                        # the variant's `server:` value
    label: str                       # how messages name it ("vLLM")
    command: tuple[str, ...]         # what starts it on a host: ("vllm", "serve")
    install_hint: str                # what to do when command[0] is not on PATH
    image: str                       # the Compose image (an ${ENV:-default} expression)
    image_entrypoint: tuple[str, ...]  # the part of `command` the image already runs
    health_path: str
    reset_prefix_cache_path: str
    dev_env: dict[str, str]          # environment that turns reset_prefix_cache on
    flags: dict[str, str]            # FLAG_CONCEPTS -> this kind's spelling
    flag_aliases: dict[str, str]     # short spellings -> long ones
    model_positional: bool           # the model comes first, without a flag
    memory_utilization_default: float
    memory_refusal: str              # what the server says when the GPU is already too full
    metrics: dict[str, str]          # canonical metric name -> the name /metrics exposes
    check_args: Callable             # (serve_args, flag map, problem(field, found, allowed)) -> None
    parse_log: Callable              # (text, ServerFacts) -> ServerFacts
    parse_metrics: Callable          # (text, ServerFacts) -> ServerFacts
    linear_path: Callable            # (ServerFacts) -> LinearPath
    speculative: Callable            # (flag map) -> {"method", "num_speculative_tokens"} | None
    # Flags servelab always passes (SGLang serves /metrics only with --enable-metrics).
    required_args: tuple[str, ...] = ()
    # Compose sets the service's entrypoint to image_entrypoint (an image without one, SGLang's).
    compose_entrypoint: bool = False
    # (serve_args, GPU memory MiB or None) -> the same settings in vLLM's spelling, which the
    # memory plan (specs.engine_config) reads; None: serve_args already are.
    engine_args: Callable | None = None
    # The KV pool is a share of the memory free at start (SGLang), not of the GPU's total (vLLM).
    memory_from_free: bool = False
    # (serve_args) -> EngineConfig fields where the kind schedules unlike vLLM (block_size as the
    # prefix-match granularity, mixed_prefill_decode, schedule_policy); None: vLLM's defaults.
    scheduling: Callable | None = None
    # How `servelab sim` writes this kind's start-up log; None: vLLM's (the simulator's own).
    sim_log: SimDialect | None = None
    # (the simulator's vLLM-shaped collector) -> a collector writing this kind's /metrics from the
    # same numbers; None: the simulator's own page (vLLM's names).
    sim_metrics: Callable | None = None
    # The server views' canonical names (analysis/38_server_metric_names.sql) -> this kind's
    # exposed name; a name left out stays NULL in the views for this kind.
    view_metrics: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [c for c in FLAG_CONCEPTS if c not in self.flags]
        if missing:
            raise ValueError(f"server kind {self.name}: flags lacks {', '.join(missing)}")

    @property
    def memory_utilization_flag(self) -> str:
        return self.flags["memory_utilization"]

    def server_args(self, model: str, serve_args, host: str | None = None,
                    port: int | None = None) -> list[str]:
        """Everything after ``command``: the model, the variant's arguments, where to listen."""
        args = [model] if self.model_positional else [self.flags["model"], model]
        args += list(serve_args)
        args += [flag for flag in self.required_args if flag not in args]
        if host is not None:
            args += [self.flags["host"], host]
        if port is not None:
            args += [self.flags["port"], str(port)]
        return args

    def engine_serve_args(self, serve_args, gpu_memory_mib: float | None = None) -> list[str]:
        """The variant's arguments as the memory plan and the simulator read them (vLLM's)."""
        if self.engine_args is None:
            return list(serve_args)
        return self.engine_args(list(serve_args), gpu_memory_mib)

    def container_command(self, model: str, serve_args, port: int) -> list[str]:
        """The Compose ``command``: what follows the image's own entrypoint."""
        rest = list(self.command[len(self.image_entrypoint):])
        return rest + self.server_args(model, serve_args, "0.0.0.0", port)
