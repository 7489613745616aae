"""KV-cache sizing at start-up, as vLLM's profile run decides it, and vLLM's start-up lines.

    requested    = GPU memory x gpu_memory_utilization
    available_kv = requested - weights - peak activations - non-torch - CUDA-graph estimate
    num_blocks   = floor(available_kv / (block_size x KV bytes per token))

``plan_kv_cache(config)`` is pure: a hardware preflight can call it (or ``preflight(...)``) to learn
whether a variant fits without starting an engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from servelab.specs.engine_config import EngineConfig, build_engine_config
from servelab.specs.hardware import GIB
from servelab.specs.serve_args import ServeArgs

NON_TORCH_GIB = 0.5        # CUDA context, NCCL buffers and allocator slack outside torch
CUDAGRAPH_GIB = 0.5        # captured graphs (vLLM's estimate); none with --enforce-eager
LOAD_GIB_PER_S = 2.0       # weight loading from a warm page cache
LOAD_FIXED_S = 1.5

NO_MEMORY_MSG = ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                 "when initializing the engine.")


@dataclass
class KVPlan:
    hardware: str
    model: str
    tensor_parallel_size: int
    gpu_memory_gib: float
    requested_gib: float
    weights_gib: float                 # per GPU (TP rank)
    activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    available_kv_gib: float
    kv_bytes_per_token: float          # per GPU, target (+ draft model) layers
    block_size: int
    num_blocks: int
    kv_tokens: int
    max_model_len: int
    load_time_s: float
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def concurrency_at(self, tokens_per_request: int) -> float:
        """Requests of this many tokens that fit at once (vLLM's "Maximum concurrency")."""
        blocks_per_req = -(-tokens_per_request // self.block_size)
        return self.num_blocks / blocks_per_req if blocks_per_req else 0.0

    @property
    def max_concurrency(self) -> float:
        return self.concurrency_at(self.max_model_len)


def weight_bytes(config: EngineConfig) -> float:
    """Weights resident on one GPU: linear layers at the quantized width, embeddings/lm_head in 16 bits."""
    m, q, tp = config.model, config.quant, config.tensor_parallel_size
    b = m.linear_params * q.weight_bytes_per_param + m.embed_params * 2
    if not m.tie_word_embeddings:
        b += m.lm_head_params * 2
    spec = config.speculative
    if spec is not None and spec.draft is not None:
        d, dq = spec.draft, spec.draft_quant
        b += d.linear_params * dq.weight_bytes_per_param + d.embed_params * 2
        if not d.tie_word_embeddings and spec.method != "eagle":
            b += d.lm_head_params * 2
    return b / tp


def kv_bytes_per_token(config: EngineConfig) -> float:
    tp = config.tensor_parallel_size
    b = config.model.kv_bytes_per_token(config.kv_dtype_bytes, tp)
    spec = config.speculative
    if spec is not None and spec.draft is not None:  # the draft's layers share the block pool
        b += spec.draft.kv_bytes_per_token(config.kv_dtype_bytes, tp)
    return b


def activation_bytes(config: EngineConfig) -> float:
    """Peak of the profile run: one forward of max_num_batched_tokens plus the sampler's fp32 logits."""
    m, tp = config.model, config.tensor_parallel_size
    tokens = config.max_num_batched_tokens
    per_token = (2 * m.intermediate_size + (m.num_heads + 2 * m.num_kv_heads) * m.head_dim) / tp + 4 * m.hidden_size
    logits = min(config.max_num_seqs, tokens) * m.vocab_size * 4
    return tokens * per_token * 2 + logits


def plan_kv_cache(config: EngineConfig) -> KVPlan:
    hw = config.hardware
    total = hw.memory_bytes
    requested = total * config.gpu_memory_utilization
    weights = weight_bytes(config)
    act = activation_bytes(config)
    graphs = 0.0 if config.enforce_eager else CUDAGRAPH_GIB * GIB
    non_torch = NON_TORCH_GIB * GIB
    if not config.memory_fraction_holds_activations:
        # The fraction holds weights + KV only (SGLang): the rest is reserved beside it.
        requested = min(total, requested + act + non_torch + graphs)
    available = requested - weights - act - non_torch - graphs
    fixed_kv = config.serve_args.kv_cache_memory_bytes if config.serve_args else None
    if fixed_kv:  # vLLM skips the memory profile and reserves exactly this (the fraction is moot)
        available = float(fixed_kv)
    kvb = kv_bytes_per_token(config)
    bs = config.block_size
    num_blocks = max(0, int(available // (bs * kvb)))
    load_s = LOAD_FIXED_S + weights / GIB / LOAD_GIB_PER_S
    plan = KVPlan(
        hardware=hw.name, model=config.model.hf_id, tensor_parallel_size=config.tensor_parallel_size,
        gpu_memory_gib=total / GIB, requested_gib=requested / GIB, weights_gib=weights / GIB,
        activation_gib=act / GIB, non_torch_gib=non_torch / GIB, cudagraph_gib=graphs / GIB,
        available_kv_gib=available / GIB, kv_bytes_per_token=kvb, block_size=bs,
        num_blocks=num_blocks, kv_tokens=num_blocks * bs, max_model_len=config.max_model_len,
        load_time_s=load_s, warnings=list(config.warnings),
    )
    plan.log_lines.extend(config.log_lines)
    _check_fit(plan, config, weights, weights + act + non_torch + graphs, available, bool(fixed_kv))
    return plan


def _check_fit(plan: KVPlan, config: EngineConfig, weights: float, used: float,
               available: float, fixed_kv: bool) -> None:
    """vLLM's start-up checks, in its order: each refusal is an error (and ends the log), each
    passed step a log line. ``used`` is weights, activations, non-torch memory and graphs."""
    hw = config.hardware
    total = hw.memory_bytes
    kvb, bs, num_blocks = plan.kv_bytes_per_token, plan.block_size, plan.num_blocks
    if weights > total:
        plan.errors.append(
            f"torch.OutOfMemoryError: CUDA out of memory. The weights of {config.model.hf_id} need "
            f"{weights / GIB:.2f} GiB per GPU but the {hw.name} has {total / GIB:.2f} GiB. Use a "
            f"quantized checkpoint, a larger --tensor-parallel-size or a larger GPU."
        )
        return
    plan.log_lines.append(f"Model loading took {weights / GIB:.4f} GiB and {plan.load_time_s:.6f} seconds")
    if fixed_kv:
        if used + available > total:
            plan.errors.append(
                f"torch.OutOfMemoryError: CUDA out of memory. --kv-cache-memory-bytes reserves "
                f"{available / GIB:.2f} GiB beside {used / GIB:.2f} "
                f"GiB of weights, activations and graphs; the {hw.name} has {total / GIB:.2f} GiB.")
            return
        plan.log_lines.append(
            f"Initial free memory {total / GIB:.2f} GiB, reserved {available / GIB:.2f} GiB memory "
            "for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.")
    if available <= 0 or num_blocks == 0:
        plan.errors.append(NO_MEMORY_MSG)
        return
    plan.log_lines.append(f"Available KV cache memory: {available / GIB:.2f} GiB")
    needed = -(-config.max_model_len // bs) * bs * kvb
    if needed > available:
        est = int(available // (bs * kvb)) * bs
        plan.errors.append(
            f"To serve at least one request with the model's max seq len ({config.max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({available / GIB:.2f} GiB). Based on the available memory, the estimated maximum "
            f"model length is {est}. Try increasing gpu_memory_utilization or decreasing max_model_len "
            f"when initializing the engine."
        )
        return
    plan.log_lines.append(f"GPU KV cache size: {plan.kv_tokens:,} tokens")
    plan.log_lines.append(
        f"Maximum concurrency for {config.max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x")
    plan.log_lines.append(
        f"Chunked prefill is enabled with max_num_batched_tokens={config.max_num_batched_tokens}.")


def preflight(hardware: str, model: str, serve_args: list[str] | ServeArgs | None = None) -> KVPlan:
    """Would this variant start? Bad names or flags raise ServelabError; capacity problems come back
    in ``plan.errors`` with vLLM's wording."""
    return plan_kv_cache(build_engine_config(hardware, model, serve_args))
