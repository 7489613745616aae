"""The simulator's coefficients: roofline efficiencies, fixed per-step costs, each kernel path's
efficiency against cuBLAS BF16, and speculative decoding's default acceptance.

These are the simulator's assumptions, calibrated against published measurements
(docs/simulator.md, ``sim.engine.calibration``); the decisions vLLM itself makes at start-up
(kernel path, batch limits, speculative config) stay in ``specs.engine_config``.
"""
from __future__ import annotations

from dataclasses import dataclass


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
