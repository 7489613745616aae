"""The simulator's coefficients: roofline efficiencies, fixed per-step costs, each kernel path's
efficiency against cuBLAS BF16, and speculative decoding's default acceptance.

These are the simulator's assumptions, calibrated against published measurements
(docs/simulator.md, ``sim.engine.calibration``); the decisions vLLM itself makes at start-up
(kernel path, batch limits, speculative config) stay in ``specs.engine_config``. A calibration
file of ``servers/calibration/`` (written by ``servelab calibrate``) replaces the defaults for
the configuration it names: ``resolve_cost`` is the one place that decides which apply.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from servelab.core import yamlsource
from servelab.core.errors import ServelabError
from servelab.core.paths import servers_dir


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


@dataclass(frozen=True)
class KernelEfficiency:
    """A kernel path against a BF16 cuBLAS GEMM: ``gemm`` is its compute efficiency (q_pen),
    ``bw`` its weight-streaming efficiency at small batch. The quantized kernels (scaled-mm
    epilogues, dequantization) reach ~90% of cuBLAS's bandwidth; the non-Marlin AWQ/GPTQ kernels
    far less."""
    gemm: float = 1.0
    bw: float = 1.0


# by specs.engine_config.QuantPath.name
KERNEL_EFFICIENCY = {
    "bf16": KernelEfficiency(1.0, 1.0),
    "fp8-w8a8": KernelEfficiency(1.0, 0.9),
    "fp8-w8a16-marlin": KernelEfficiency(0.85, 0.9),
    "w4a16-marlin": KernelEfficiency(0.85, 0.9),
    "awq-gemm": KernelEfficiency(0.35, 0.5),
    "gptq-exllama": KernelEfficiency(0.5, 0.7),
}

# Conditional per-position acceptance defaults. EAGLE: vllm PR #24344 measured 0.77/0.45/0.24
# unconditional for k=3, i.e. 0.77, 0.58, 0.53 conditional.
_EAGLE_ACCEPT = (0.77, 0.584, 0.533)
# Chat text repeats the prompt less often than code edits; a lookup finds a match in about four
# steps of ten (vllm PR #24344: 15% of code-edit tokens got no draft).
NGRAM_MATCH_PROB = 0.4


def default_acceptance(method: str, k: int) -> tuple[float, ...]:
    """Conditional acceptance probability of each of the ``k`` draft positions."""
    if method in ("eagle", "eagle3"):
        return tuple(_EAGLE_ACCEPT[i] if i < len(_EAGLE_ACCEPT) else 0.5 for i in range(k))
    if method == "ngram":
        return tuple(0.7 * 0.95 ** i for i in range(k))
    return tuple(0.75 * 0.96 ** i for i in range(k))  # small draft model of the same family


def match_probability(method: str) -> float:
    """Chance that a step gets a proposal at all (only prompt lookup can find nothing)."""
    return NGRAM_MATCH_PROB if method == "ngram" else 1.0


# ---- calibration files ---------------------------------------------------------------------
CALIBRATION_FORMAT = "servelab-calibration/1"
CALIBRATION_DIR_ENV = "SERVELAB_CALIBRATION_DIR"
PARAM_NAMES = tuple(f.name for f in fields(CostParams))
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
    line = yamlsource.line_of(doc, field) if doc is not None else 1
    name = ".".join(str(p) for p in field) or "(file)"
    raise ServelabError(f"{path}:{line}: {name}: found {found!r}; allowed {allowed}")


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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            _fail(path, doc, ("params", name), value, "a positive number")
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
    for cal in calibrations(directory):
        if (cal.hardware.lower() == config.hardware.name.lower()
                and cal.model == config.model.hf_id and cal.applies_to == scope):
            return cal
    return None


def resolve_cost(config, cost: CostParams | None = None) -> tuple[CostParams, str]:
    """The coefficients a step of ``config`` is priced with, and what they came from. Explicit
    coefficients other than the defaults win (a what-if or a fit in progress); otherwise a
    matching calibration file replaces the defaults."""
    if cost is not None and cost != CostParams():
        return cost, "coefficients given by the caller"
    cal = find_calibration(config)
    if cal is None:
        return CostParams(), DEFAULTS_LABEL
    return cal.params, cal.label


def calibrated_acceptance(config) -> tuple[float, ...] | None:
    """The per-position acceptance a matching calibration measured, when it measured one for
    exactly this many draft tokens (else the spec decoder keeps its method's default)."""
    cal = find_calibration(config)
    spec = getattr(config, "speculative", None)
    if cal is None or spec is None or not cal.spec_acceptance:
        return None
    acc = tuple(cal.spec_acceptance)
    return acc if len(acc) == spec.num_speculative_tokens else None
