"""The simulator's cost coefficients and the calibration files that set them.

``CostParams`` are the simulator's assumptions (docs/simulator.md); a file of
``servers/calibration/`` (written by ``servelab calibrate``) replaces the defaults for the
configuration it names. Here the files are read and checked like every other file under
``servers/`` (each problem names the file, line and field); ``sim.engine.costs.resolve_cost``
decides which coefficients a step is priced with.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from servelab.core import yamlsource
from servelab.core.errors import ServelabError
from servelab.core.paths import servers_dir
from servelab.specs.models import canonical_id


@dataclass(frozen=True)
class CostParams:
    """Roofline efficiencies and fixed costs (docs/simulator.md explains and calibrates them)."""
    eta_bw: float = 0.75            # achieved / peak memory bandwidth for weight and KV streaming
    eta_compute: float = 0.65       # achieved / peak tensor FLOPS in GEMMs
    eta_attn: float = 0.5           # achieved / peak FLOPS in attention
    t_cpu_s: float = 0.0008         # scheduler, input prep, sampling, output processing per step
    t_layer_s: float = 10e-6        # norms, rope, activation, kernel tails per layer per step (CUDA graphs)
    eager_layer_s: float = 45e-6    # extra launch cost per layer per step with --enforce-eager
    t_prefill_req_s: float = 30e-6  # per prefill chunk in the batch (metadata, no CUDA graph)
    t_seq_s: float = 8e-6           # per request in the batch (scheduling, input prep, detokenizing)
    t_draft_pass_s: float = 60e-6   # per draft-model pass (proposal bookkeeping, sampling)
    t_ngram_seq_s: float = 4e-6     # n-gram prompt lookup per request (CPU)
    t_tp_step_s: float = 300e-6     # TP > 1: broadcasting each step's inputs to the worker processes
    alpha_ar_custom_s: float = 10e-6  # one all-reduce, NVLink with vLLM's custom all-reduce
    alpha_ar_nccl_s: float = 40e-6    # NVLink with NCCL (custom AR disabled)
    alpha_ar_pcie_s: float = 55e-6    # PCIe through NCCL
    act_quant_overhead: float = 0.03  # dynamic per-token activation quantization for W8A8
    # The engine core's host side of a step (schedule, input prep, launch, update_from_output),
    # which async scheduling overlaps with the previous step's forward (``sim.engine.pipeline``):
    # a step costs max(GPU, host) back to back and host + GPU on an idle engine. Zero: off.
    t_host_s: float = 0.0
    t_host_seq_s: float = 0.0       # per request in the step
    # Input preparation per prompt token the step schedules (``sim.engine.pipeline``). Zero: off.
    t_host_prompt_token_s: float = 0.0
    t_eager_step_s: float = 0.0     # a step over the largest CUDA graph (512 tokens) launches eagerly
    t_idle_step_s: float = 0.0      # a step that starts on an idle engine: the busy loop's wake-up
    # The API server (``sim.engine.frontend``): one CPU for parsing, tokenizing and streaming.
    api_request_s: float = 0.0      # per request (parse, validate, the hop to the engine)
    api_prompt_token_s: float = 0.0  # per prompt token (tokenizing and the Python around it)
    api_chunk_s: float = 0.0        # per streamed chunk (detokenize, SSE, write)
    api_step_s: float = 0.0         # per engine step's outputs (receive, decode)
    # A new request's hand-off on a loop busy with output (``sim.engine.frontend``): per prompt
    # token on its path beyond api_prompt_token_s, in full from this share of the loop in output.
    api_busy_prompt_token_s: float = 0.0
    api_busy_full_load: float = 0.0
    # FP8 W8A8 on SM90: CUTLASS's tile for a step of 17-64 tokens (``sim.engine.cost_model``)
    # streams the FP8 weights slower than the 1-16-token one; the extra share of that time.
    fp8_m64_weight_extra: float = 0.0
    # The engine core's input thread (``sim.engine.pipeline``): GIL turns a new request needs
    # while the busy loop does host work (one per switch interval), and the GPU wait that lets
    # every queued request through. 0 turns: off (requests reach the scheduler as they arrive).
    input_gil_turns: float = 0.0
    input_free_wait_s: float = 0.0


# Which mechanism each coefficient belongs to: ``servelab calibrate`` writes this beside the
# fitted values so that a reader of a calibration file knows what each number prices.
MECHANISMS = {
    "eta_bw": "gpu_forward", "eta_compute": "gpu_forward", "eta_attn": "gpu_forward",
    "t_cpu_s": "gpu_forward", "t_layer_s": "gpu_forward", "eager_layer_s": "gpu_forward",
    "t_prefill_req_s": "gpu_forward", "t_seq_s": "gpu_forward", "t_draft_pass_s": "spec_decode",
    "t_ngram_seq_s": "spec_decode", "t_tp_step_s": "tensor_parallel",
    "alpha_ar_custom_s": "tensor_parallel", "alpha_ar_nccl_s": "tensor_parallel",
    "alpha_ar_pcie_s": "tensor_parallel", "act_quant_overhead": "gpu_forward",
    "t_host_s": "async_scheduling_host", "t_host_seq_s": "async_scheduling_host",
    "t_host_prompt_token_s": "host_input_prep",
    "t_eager_step_s": "idle_fixed_cost", "t_idle_step_s": "idle_fixed_cost",
    "api_request_s": "api_server_cpu", "api_prompt_token_s": "api_server_cpu",
    "api_chunk_s": "api_server_cpu", "api_step_s": "api_server_cpu",
    "api_busy_prompt_token_s": "api_hand_off_load", "api_busy_full_load": "api_hand_off_load",
    "fp8_m64_weight_extra": "fp8_gemm_tile",
    "input_gil_turns": "engine_input_thread", "input_free_wait_s": "engine_input_thread",
}


CALIBRATION_FORMAT = "servelab-calibration/1"
CALIBRATION_DIR_ENV = "SERVELAB_CALIBRATION_DIR"
PARAM_NAMES = tuple(f.name for f in fields(CostParams))
# Coefficients whose default 0 turns their mechanism off (the rest are efficiencies and costs
# every step has).
OPTIONAL_PARAMS = frozenset(n for n, m in MECHANISMS.items()
                            if m in ("async_scheduling_host", "idle_fixed_cost", "api_server_cpu",
                                     "api_hand_off_load", "fp8_gemm_tile",
                                     "engine_input_thread", "host_input_prep"))
DEFAULTS_LABEL = "built-in defaults (the published-table H100 calibration)"
SCOPE_KEYS = ("kernel_path", "tensor_parallel_size", "kv_cache_dtype", "enforce_eager",
              "speculative")


@dataclass(frozen=True)
class Calibration:
    """One calibration file: the coefficients it fits and the engine configuration it is for."""
    path: Path
    params: CostParams
    hardware: str
    model: str
    variant: str
    applies_to: dict
    source: str                      # "probes" (servelab calibrate) or "published-table"
    spec_acceptance: tuple[float, ...] | None = None

    @property
    def label(self) -> str:
        return f"calibration {self.path.name} ({self.source}, variant {self.variant})"


def calibration_dir() -> Path:
    """Where calibrations are looked up; the variable lets a test or a what-if point elsewhere."""
    return Path(os.environ.get(CALIBRATION_DIR_ENV) or servers_dir() / "calibration")


def applies_to(config) -> dict:
    """What must match between an engine configuration and a calibration: the hardware and
    model are fields of their own; these decide which kernels and collectives a step runs."""
    spec = config.speculative
    return {"kernel_path": config.quant.name, "tensor_parallel_size": config.tensor_parallel_size,
            "kv_cache_dtype": config.kv_cache_dtype, "enforce_eager": config.enforce_eager,
            "speculative": f"{spec.method}:{spec.num_speculative_tokens}" if spec else "none"}


def _fail(path: Path, doc, field: tuple, found, allowed: str):
    raise ServelabError(yamlsource.field_message(path, doc, field,
                                                 f"found {found!r}; allowed {allowed}"))


def load_calibration(path: str | os.PathLike) -> Calibration:
    """Read and check one calibration file; every problem names the file, line and field."""
    path = Path(path)
    try:
        doc = yamlsource.parse(path.read_text())
    except OSError as exc:
        raise ServelabError(f"{path}: cannot read the calibration ({exc.strerror})") from None
    except yamlsource.YamlSyntaxError as exc:
        raise ServelabError(f"{path}:{exc.line}: not YAML: {exc}") from None
    data = doc.data
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        _fail(path, doc, ("format",), data.get("format") if isinstance(data, dict) else data,
              f"{CALIBRATION_FORMAT!r} (the file servelab calibrate writes)")
    for key in ("hardware", "model", "variant", "source"):
        if not isinstance(data.get(key), str) or not data[key]:
            _fail(path, doc, (key,), data.get(key), "a non-empty string")
    scope = data.get("applies_to")
    if not isinstance(scope, dict) or set(scope) != set(SCOPE_KEYS):
        _fail(path, doc, ("applies_to",), scope, f"a mapping of exactly {', '.join(SCOPE_KEYS)}")
    params = data.get("params")
    if not isinstance(params, dict) or not params:
        _fail(path, doc, ("params",), params, f"a mapping of cost coefficients ({', '.join(PARAM_NAMES)})")
    values = {}
    for name, value in params.items():
        if name not in PARAM_NAMES:
            _fail(path, doc, ("params", name), name, f"one of {', '.join(PARAM_NAMES)}")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        least_ok = number and (value >= 0 if name in OPTIONAL_PARAMS else value > 0)
        if not least_ok:
            _fail(path, doc, ("params", name), value,
                  "a number >= 0 (0: mechanism off)" if name in OPTIONAL_PARAMS
                  else "a positive number")
        if name.startswith("eta_") and value > 1:
            _fail(path, doc, ("params", name), value, "an efficiency in (0, 1]")
        values[name] = float(value)
    spec = data.get("spec_decode")
    acceptance = None
    if spec is not None:
        acc = spec.get("acceptance") if isinstance(spec, dict) else None
        if not isinstance(acc, list) or not all(
                isinstance(a, (int, float)) and 0 <= a <= 1 for a in acc):
            _fail(path, doc, ("spec_decode", "acceptance"), acc,
                  "a list of per-position acceptance probabilities in [0, 1]")
        acceptance = tuple(float(a) for a in acc)
    return Calibration(path, replace(CostParams(), **values), data["hardware"], data["model"],
                       data["variant"], dict(scope), data["source"], acceptance)


@lru_cache(maxsize=8)
def _load_dir(directory: str, stamp: tuple) -> tuple[Calibration, ...]:
    return tuple(load_calibration(Path(directory) / name) for name, _ in stamp)


def calibrations(directory: Path | None = None) -> tuple[Calibration, ...]:
    """Every calibration of ``directory`` (cached until a file there changes)."""
    d = directory or calibration_dir()
    if not d.is_dir():
        return ()
    stamp = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in d.glob("*.yaml")))
    return _load_dir(str(d), stamp)


def find_calibration(config, directory: Path | None = None) -> Calibration | None:
    """The calibration whose hardware, model and kernel scope equal the configuration's."""
    scope = applies_to(config)
    # A local model folder holding a known model's config.json is that model.
    ids = {config.model.hf_id, canonical_id(config.model)}
    for cal in calibrations(directory):
        if (cal.hardware.lower() == config.hardware.name.lower()
                and cal.model in ids and cal.applies_to == scope):
            return cal
    return None
