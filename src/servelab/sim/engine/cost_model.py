"""Step time from a roofline (vllm_behaviour.md section 6), where nano-vllm has its model runner.

A step's batch is summarised by a few sums (``BatchShape``); its time is

    T = T_linear + T_attention + T_allreduce + T_fixed (+ draft passes, added by the engine)

with every term the max of a bytes/bandwidth and a FLOPs/peak bound, using the peak of the
precision the GEMMs really run at (FP8 only where the GPU has FP8 tensor cores).

The weight-streaming bound is not one rate for every batch on FP8 W8A8 (issue 22, fifth pass).
vLLM 0.26 runs ``--quantization fp8`` through ``CutlassFP8ScaledMMLinearKernel`` (the H200
capture's start-up log), and ``cutlass_gemm_sm90_fp8_dispatch``
(csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_fp8_dispatch.cuh) picks its tile by the
token count m: 64x16x256 with swapped operands for m <= 16, 64x64x256 for 16 < m <= 64,
64x128x128 and 128x128x128 past that. The 17-64-token tile pads the tokens to 64 and holds
fewer pipeline stages, so its weights stream slower than the small tile's, which the 1-user
TPOT (``eta_bw``) prices: a step of 17-64 tokens pays ``fp8_m64_weight_extra`` of the
quantized weights' streaming time more (the capture's FP8 decode steps at 31 decodes take
5.3 ms, the roofline 4.3; BF16's cuBLAS steps there are within 6%). Fitted by
bench/fit_h200_engine.py; 0 (every file without it): off.
"""
from __future__ import annotations

from dataclasses import dataclass

from servelab.sim.engine.costs import KERNEL_EFFICIENCY, resolve_cost
from servelab.specs.cost_calibration import CostParams
from servelab.specs.engine_config import EngineConfig, QuantPath
from servelab.specs.hardware import HardwareSpec
from servelab.specs.models import ModelSpec

# The token counts CUTLASS's SM90 FP8 dispatch runs with its 64x64x256 tile (m in (16, 64]).
M64_TILE = (16, 64)


@dataclass
class BatchShape:
    """Sums over the requests in one step.

    Decode set D: request i reads a context of l_i tokens and verifies k_i draft tokens.
    Prefill set P: chunk j computes c_j new tokens on top of p_j already in the cache.
    """
    num_decode: int = 0
    decode_tokens: int = 0      # sum(1 + k_i)
    decode_context: int = 0     # sum(l_i)
    decode_context_x: int = 0   # sum(l_i * (1 + k_i))
    num_prefill: int = 0
    prefill_tokens: int = 0     # sum(c_j)
    prefill_context: int = 0    # sum(p_j + c_j)
    prefill_attn: float = 0.0   # sum(c_j * (p_j + c_j / 2))

    @property
    def num_tokens(self) -> int:
        return self.decode_tokens + self.prefill_tokens

    @property
    def num_seqs(self) -> int:
        return self.num_decode + self.num_prefill

    def add_decode(self, context: int, num_spec: int = 0) -> None:
        self.num_decode += 1
        self.decode_tokens += 1 + num_spec
        self.decode_context += context
        self.decode_context_x += context * (1 + num_spec)

    def add_prefill(self, new_tokens: int, prior_tokens: int) -> None:
        self.num_prefill += 1
        self.prefill_tokens += new_tokens
        self.prefill_context += prior_tokens + new_tokens
        self.prefill_attn += new_tokens * (prior_tokens + new_tokens / 2)


class CostModel:
    """Forward-pass time of one model on ``tp`` GPUs of one kind."""

    def __init__(self, hw: HardwareSpec, model: ModelSpec, quant: QuantPath, cost: CostParams,
                 tp: int = 1, kv_dtype_bytes: float = 2.0, custom_all_reduce: bool = True,
                 enforce_eager: bool = False, include_cpu: bool = True):
        self.hw, self.model, self.quant, self.params, self.tp = hw, model, quant, cost, tp
        bw = hw.bandwidth_gb_s * 1e9 * cost.eta_bw
        L = model.num_layers
        kernel = KERNEL_EFFICIENCY[quant.name]
        # Weight streaming: quantized linear layers at their kernel's bandwidth, lm_head in 16 bits.
        linear_weights = model.linear_params * quant.weight_bytes_per_param / (bw * kernel.bw)
        self.t_weights = (linear_weights + model.lm_head_params * 2 / bw) / tp
        # lm_head stays BF16 (cuBLAS): only the quantized layers take CUTLASS's m-tile.
        self.t_m64_extra = (linear_weights / tp * cost.fp8_m64_weight_extra
                            if quant.name == "fp8-w8a8" else 0.0)
        gemm_peak = quant.gemm_tflops * 1e12 * kernel.gemm * cost.eta_compute
        head_peak = hw.tflops_bf16 * 1e12 * cost.eta_compute
        self.s_per_token_lin = 2 * model.linear_params / (tp * gemm_peak)
        self.s_per_token_head = 2 * model.lm_head_params / (tp * head_peak)
        self.act_quant = 1.0 + (cost.act_quant_overhead if quant.act_quant else 0.0)
        self.kv_bytes = model.kv_bytes_per_token(kv_dtype_bytes, tp)
        self.bw = bw
        self.attn_flops_per = 4 * L * model.num_heads * model.head_dim / tp
        self.attn_peak = hw.tflops_bf16 * 1e12 * cost.eta_attn
        if tp > 1:
            if hw.link_type == "nvlink":
                alpha = cost.alpha_ar_custom_s if custom_all_reduce else cost.alpha_ar_nccl_s
            else:
                alpha = cost.alpha_ar_pcie_s
            self.n_allreduce = 2 * L
            self.alpha_ar = alpha
            self.ar_s_per_token = 2 * (tp - 1) / tp * model.hidden_size * 2 / (hw.allreduce_gb_s * 1e9)
        else:
            self.n_allreduce = 0
            self.alpha_ar = 0.0
            self.ar_s_per_token = 0.0
        per_layer = cost.t_layer_s + (cost.eager_layer_s if enforce_eager else 0.0)
        self.t_fixed = L * per_layer + (cost.t_cpu_s if include_cpu else 0.0)
        if tp > 1 and include_cpu:
            self.t_fixed += cost.t_tp_step_s

    def linear_time(self, num_tokens: int, num_head_tokens: int) -> float:
        compute = num_tokens * self.s_per_token_lin + num_head_tokens * self.s_per_token_head
        weights = self.t_weights
        if self.t_m64_extra and M64_TILE[0] < num_tokens <= M64_TILE[1]:
            weights += self.t_m64_extra
        return max(weights, compute) * self.act_quant

    def attention_time(self, b: BatchShape) -> float:
        kvb, bw, f, peak = self.kv_bytes, self.bw, self.attn_flops_per, self.attn_peak
        t = 0.0
        if b.num_decode:
            t += max(kvb * b.decode_context / bw, f * b.decode_context_x / peak)
        if b.num_prefill:
            t += max(kvb * b.prefill_context / bw, f * b.prefill_attn / peak)
        return t

    def allreduce_time(self, num_tokens: int) -> float:
        if not self.n_allreduce:
            return 0.0
        return self.n_allreduce * (self.alpha_ar + num_tokens * self.ar_s_per_token)

    def step_time(self, b: BatchShape) -> float:
        if b.num_tokens == 0:
            return 0.0
        n = b.num_tokens
        # Logits are computed for decode positions (and draft positions) and each prefill chunk's last token.
        head_tokens = b.decode_tokens + b.num_prefill
        p = self.params
        return (self.linear_time(n, head_tokens) + self.attention_time(b) + self.allreduce_time(n)
                + self.t_fixed + b.num_prefill * p.t_prefill_req_s + b.num_seqs * p.t_seq_s)


def target_cost_model(config: EngineConfig, cost: CostParams | None) -> CostModel:
    """The target model's step time; the defaults give way to a matching calibration file
    (``costs.resolve_cost``), so the HTTP simulator and predict price steps alike."""
    return priced(config, resolve_cost(config, cost)[0])


def priced(config: EngineConfig, cost: CostParams) -> CostModel:
    """The target model's step time with exactly these coefficients (no calibration lookup:
    what ``servelab calibrate`` evaluates while it fits)."""
    return CostModel(config.hardware, config.model, config.quant, cost,
                     tp=config.tensor_parallel_size, kv_dtype_bytes=config.kv_dtype_bytes,
                     custom_all_reduce=config.custom_all_reduce, enforce_eager=config.enforce_eager)


def draft_cost_model(config: EngineConfig, cost: CostParams | None) -> CostModel | None:
    spec = config.speculative
    if spec is None or spec.draft is None:
        return None
    cost, _ = resolve_cost(config, cost)
    return CostModel(config.hardware, spec.draft, spec.draft_quant, cost,
                     tp=config.tensor_parallel_size, kv_dtype_bytes=config.kv_dtype_bytes,
                     custom_all_reduce=config.custom_all_reduce, enforce_eager=config.enforce_eager,
                     include_cpu=False)
