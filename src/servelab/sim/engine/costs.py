"""Which coefficients price a step: each kernel path's efficiency against cuBLAS BF16,
speculative decoding's default acceptance, and ``resolve_cost``, the one place that decides
between the defaults and a calibration file.

The coefficients (``CostParams``) and the calibration files (``servers/calibration/``, written
by ``servelab calibrate``) are read in ``specs.cost_calibration``; the decisions vLLM itself makes
at start-up (kernel path, batch limits, speculative config) stay in ``specs.engine_config``.
"""
from __future__ import annotations

from dataclasses import dataclass

from servelab.specs.cost_calibration import DEFAULTS_LABEL, CostParams, find_calibration


@dataclass(frozen=True)
class KernelEfficiency:
    """A kernel path against a BF16 cuBLAS GEMM: ``gemm`` is its compute efficiency (q_pen),
    ``bw`` its weight-streaming efficiency at small batch. FP8's scaled-mm epilogues and
    Marlin's dequantization reach ~90% of cuBLAS's bandwidth; Machete's 4-bit weights on an H200,
    measured, only 42%; the non-Marlin AWQ/GPTQ kernels less still."""
    gemm: float = 1.0
    bw: float = 1.0


# by specs.engine_config.QuantPath.name. w4a16-machete (GPTQ/AWQ 4-bit on Hopper, where vLLM 0.26
# picks MacheteLinearKernel) is what bench/fit_int4_kernel.py fits to the H200 capture
# servers/captured/h200_20261202/{gptq,awq}_int4/phases_*: bw to the 1-user TPOT p50 (3.56 /
# 3.70 ms; batch-1 weight streaming reaches only ~0.42 of cuBLAS BF16's rate), gemm to the 1-user
# prefill spans against prompt length, as a ratio to the same fit of the bf16 run priced with the
# BF16 calibration (refitted to the same capture's iteration lines, eta_compute 0.65: the ratio
# is 1.19, Machete's prefill a little faster than cuBLAS BF16's under equal coefficients). Both
# hold for the coefficients an H200 Int4 config is priced with today, the built-in defaults
# (servers/calibration has no Int4 file): refit if one is added, or if the BF16 file changes.
KERNEL_EFFICIENCY = {
    "bf16": KernelEfficiency(1.0, 1.0),
    "fp8-w8a8": KernelEfficiency(1.0, 0.9),
    "fp8-w8a16-marlin": KernelEfficiency(0.85, 0.9),
    "w4a16-machete": KernelEfficiency(1.19, 0.42),
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
