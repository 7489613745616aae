"""A server's engine configuration, decided the way vLLM decides it at start-up.

``build_engine_config(hardware, model, serve_args)`` applies vLLM's per-GPU batch defaults, picks
the quantization kernel path (native FP8 W8A8, FP8 weight-only Marlin below cc 8.9, W4A16 for
GPTQ/AWQ checkpoints through Machete on Hopper and Marlin elsewhere, the slow kernels when
``--quantization awq|gptq`` is forced) and reads ``--speculative-config``. It records vLLM's log lines for those decisions in ``log_lines``.
Preflight, verify, predict and the simulator read it; the simulator's own cost coefficients live
in ``specs.cost_calibration`` (chosen by ``sim.engine.costs.resolve_cost``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from servelab.core.errors import ServelabError
from servelab.specs.hardware import GIB, HardwareSpec, load_hardware
from servelab.specs.models import ModelSpec, load_model
from servelab.specs.serve_args import ServeArgs, parse_serve_args

FP8_MARLIN_WARNING = (
    "Your GPU does not have native support for FP8 computation but FP8 quantization is being used. "
    "Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade "
    "performance for compute-heavy workloads."
)
CUSTOM_AR_WARNING = (
    "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. "
    "To silence this warning, specify disable_custom_all_reduce=True explicitly."
)
W4_BYTES_PER_PARAM = 0.516  # 4-bit weights plus fp16 group scales (group 128) and zero points


@dataclass(frozen=True)
class QuantPath:
    """How the linear layers run."""
    # bf16 | fp8-w8a8 | fp8-w8a16-marlin | w4a16-machete | w4a16-marlin | awq-gemm | gptq-exllama
    name: str
    method: str | None             # vLLM's quantization name (None for unquantized)
    weight_bytes_per_param: float  # quantizable linear layers; embeddings and lm_head stay 16-bit
    gemm_tflops: float             # peak of the precision the GEMMs actually run at
    act_quant: bool = False        # activations quantized per token at run time (W8A8)
    kernel: str = ""


@dataclass(frozen=True)
class SpecDecodeConfig:
    method: str                       # ngram | draft_model | eagle | eagle3
    num_speculative_tokens: int
    draft: ModelSpec | None           # draft_model: its config; eagle: a one-layer head synthesized
    draft_quant: QuantPath | None
    raw: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig:
    hardware: HardwareSpec
    model: ModelSpec
    served_model_names: tuple[str, ...]
    quant: QuantPath
    tensor_parallel_size: int
    data_parallel_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    block_size: int
    enable_prefix_caching: bool
    kv_cache_dtype: str
    kv_dtype_bytes: float
    enforce_eager: bool
    custom_all_reduce: bool
    speculative: SpecDecodeConfig | None
    serve_args: ServeArgs
    log_lines: tuple[str, ...]        # vLLM's log lines for the decisions above (warnings included)
    warnings: tuple[str, ...]
    # Scheduling knobs where serving frameworks differ (a kind's ``scheduling`` sets them; the
    # defaults are vLLM V1's): decodes share a step with prefill chunks (vLLM's mixed batches;
    # SGLang only with --enable-mixed-chunk), and the waiting queue's order (fcfs, or SGLang's
    # lpm: longest cached prefix first). ``block_size`` above is also the prefix cache's match
    # granularity: vLLM's 16-token blocks, SGLang's page_size 1.
    mixed_prefill_decode: bool = True
    schedule_policy: str = "fcfs"
    # vLLM's --gpu-memory-utilization bounds everything the engine allocates; SGLang's
    # --mem-fraction-static weights + KV pool only (activations and graphs live outside it).
    memory_fraction_holds_activations: bool = True
    # The simulator's own allocation unit when ``block_size`` is finer (None: block_size): a
    # token-granular cache then still allocates 16-token blocks, which keeps a step's cost that
    # of vLLM's blocks (sim.engine.block_manager says what that approximates).
    kv_page_tokens: int | None = None
    server_kind: str = "vllm"         # whose log and /metrics dialect the simulator speaks
    # vLLM's native CPU KV offloading (sim.engine.kv_offload): bytes of CPU memory for all TP
    # ranks together, or a block count given as num_cpu_blocks; 0 / None: no CPU tier.
    kv_offload_bytes: float = 0.0
    kv_offload_num_cpu_blocks: int | None = None
    # Whose tier: "native" (the OffloadingConnector) or "lmcache" (LMCacheConnectorV1, its
    # local CPU backend: chunk tokens and whether decoded tokens are saved, LMCache's defaults).
    kv_offload_backend: str = "native"
    lmcache_chunk_size: int = 256
    lmcache_save_decode: bool = False

    @property
    def kv_offload(self) -> bool:
        return bool(self.kv_offload_bytes or self.kv_offload_num_cpu_blocks)

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.speculative is None else self.speculative.num_speculative_tokens


def batch_defaults(hw: HardwareSpec) -> tuple[int, int]:
    """vLLM's get_batch_defaults for the OpenAI API server: (max_num_batched_tokens, max_num_seqs)."""
    names = " ".join((hw.name,) + hw.nvidia_smi_names).lower()
    if hw.memory_bytes >= 70 * GIB and "a100" not in names:
        return 8192, 1024
    return 2048, 256


_COMPATIBLE = {"gptq": {"gptq", "gptq_marlin", "marlin"}, "awq": {"awq", "awq_marlin"},
               "fp8": {"fp8"}, "compressed-tensors": {"compressed-tensors"}}


def choose_quant_path(hw: HardwareSpec, model: ModelSpec, requested: str | None,
                      tp: int = 1) -> tuple[QuantPath, list[str], list[str]]:
    """Returns (path, log lines, warnings) following vLLM's kernel selection."""
    ckpt = model.quant_method
    logs: list[str] = []
    warns: list[str] = []
    if ckpt and requested and requested not in _COMPATIBLE.get(ckpt, {ckpt}):
        raise ServelabError(
            f"Quantization method specified in the model config ({ckpt}) does not match the "
            f"quantization method specified in the `quantization` argument ({requested}). "
            f"(model {model.hf_id}: drop --quantization or pick a checkpoint quantized with {requested})"
        )
    method = requested or ckpt
    bf16 = hw.tflops_bf16
    if method is None:
        return QuantPath("bf16", None, 2.0, bf16, kernel="cuBLAS BF16"), logs, warns
    if method == "fp8":
        if hw.native_fp8:
            logs.append("Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod")
            return QuantPath("fp8-w8a8", "fp8", 1.0, hw.tflops_fp8, act_quant=True,
                             kernel="CutlassFP8ScaledMMLinearKernel"), logs, warns
        logs.append("Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod")
        warns.append(FP8_MARLIN_WARNING)
        return QuantPath("fp8-w8a16-marlin", "fp8", 1.0, bf16,
                         kernel="MarlinFP8ScaledMMLinearKernel"), logs, warns
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "marlin"):
        if ckpt not in ("gptq", "awq"):
            raise ServelabError(
                f"Cannot find the config file for {method} (model {model.hf_id} is not a {method} "
                f"checkpoint; use a pre-quantized model such as Qwen/Qwen2.5-7B-Instruct-AWQ)"
            )
        bits = int(model.quantization_config.get("bits", 4))
        if bits != 4:
            raise ServelabError(f"{model.hf_id}: quantization_config.bits: found {bits}; the simulator models 4-bit only")
        if requested in ("awq", "gptq"):
            marlin = f"{requested}_marlin"
            logs.append(
                f"Detected that the model can run with {marlin}, however you specified "
                f"quantization={requested} explicitly, so forcing {requested}. Use "
                f"quantization={marlin} for faster inference"
            )
            if requested == "awq":
                return QuantPath("awq-gemm", "awq", W4_BYTES_PER_PARAM, bf16,
                                 kernel="AWQ GEMM"), logs, warns
            return QuantPath("gptq-exllama", "gptq", W4_BYTES_PER_PARAM, bf16,
                             kernel="ExllamaLinearKernel"), logs, warns
        marlin = f"{ckpt}_marlin"
        logs.append(f"The model is convertible to {marlin} during runtime. Using {marlin} kernel.")
        kernels = w4a16_kernels(hw, model, tp)
        logs += [f"Using {k} for {ckpt.upper()}MarlinLinearMethod" for k in kernels]
        # A model split between Machete and Marlin (act-order with TP) runs both in every step;
        # it is priced as Marlin, the kernel of the layers that fell back.
        if kernels == ("MacheteLinearKernel",):
            return QuantPath("w4a16-machete", marlin, W4_BYTES_PER_PARAM, bf16,
                             kernel="MacheteLinearKernel"), logs, warns
        return QuantPath("w4a16-marlin", marlin, W4_BYTES_PER_PARAM, bf16,
                         kernel="MarlinLinearKernel"), logs, warns
    raise ServelabError(f"--quantization {method}: not simulated; use fp8, awq, gptq (or their _marlin forms)")


def w4a16_kernels(hw: HardwareSpec, model: ModelSpec, tp: int = 1) -> tuple[str, ...]:
    """The kernels vLLM 0.26 builds a 4-bit GPTQ/AWQ checkpoint's linear layers with, in the order
    its "Using X for ..." lines appear (one line per kernel class, at its first layer).

    vllm/model_executor/kernels/linear/__init__.py ``choose_mp_linear_kernel`` tries, on CUDA,
    CutlassW4A8 (FP8 activations only: never for W4A16), Machete, AllSpark, Marlin, ... and takes
    the first whose ``can_implement`` accepts the layer. mixed_precision/machete.py
    ``MacheteLinearKernel.can_implement``: compute capability exactly 9.0 (Hopper), no act-order
    (g_idx) on a layer whose input is split across TP ranks, group size -1/64/128 for 16-bit
    activations, and (machete_utils ``check_machete_supports_shape``) the rank's input features a
    multiple of 64, output features of 128. AllSpark would take per-channel (group -1) layers
    without zero points on 8.x; the simulator prices those as Marlin (no AllSpark path).
    """
    if hw.compute_capability != (9, 0):
        return ("MarlinLinearKernel",)
    q = model.quantization_config or {}
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    act_order = bool(q.get("desc_act")) and group != -1   # auto_gptq drops desc_act at group -1
    h, i = model.hidden_size, model.intermediate_size
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    # (input features, output features, input split across ranks) of one rank's layer
    layers = ((h, qkv // tp, False), (model.num_heads * model.head_dim // tp, h, tp > 1),
              (h, 2 * i // tp, False), (i // tp, h, tp > 1))
    picked = []
    for k_in, n_out, row_split in layers:
        machete = (group in (-1, 64, 128) and not (act_order and row_split)
                   and k_in % 64 == 0 and n_out % 128 == 0)
        kernel = "MacheteLinearKernel" if machete else "MarlinLinearKernel"
        if kernel not in picked:
            picked.append(kernel)
    return tuple(picked)


def _eagle_head(target: ModelSpec, method: str) -> ModelSpec:
    """EAGLE's draft is one decoder layer of the target's width; EAGLE-3 has its own 32k-vocab head."""
    cfg = dict(target.config, num_hidden_layers=1, quantization_config=None)
    if method == "eagle3":
        cfg["vocab_size"] = 32000
    from servelab.specs.models import model_from_config
    return model_from_config(f"{target.hf_id}#{method}-head", cfg, "synthesized")


def parse_speculative(spec: dict, hw: HardwareSpec, target: ModelSpec) -> SpecDecodeConfig:
    method = spec.get("method")
    model_name = spec.get("model")
    if method is None:
        if model_name is None:
            raise ServelabError("--speculative-config: give \"method\" (ngram, draft_model, eagle, eagle3) or \"model\"")
        method = "eagle3" if "eagle3" in model_name.lower() else "eagle" if "eagle" in model_name.lower() else "draft_model"
    if method == "[ngram]":
        method = "ngram"
    if method not in ("ngram", "draft_model", "eagle", "eagle3"):
        raise ServelabError(f"--speculative-config: method: found {method!r}; simulated: ngram, draft_model, eagle, eagle3")
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or k < 1:
        raise ServelabError("--speculative-config: num_speculative_tokens: expected a positive integer")
    draft = None
    draft_quant = None
    if method == "draft_model":
        if not model_name:
            raise ServelabError("--speculative-config: method draft_model needs \"model\", e.g. Qwen/Qwen2.5-0.5B-Instruct")
        draft = load_model(model_name)
        draft_quant, _, _ = choose_quant_path(hw, draft, spec.get("quantization"))
    elif method in ("eagle", "eagle3"):
        draft = _eagle_head(target, method)
        draft_quant = QuantPath("bf16", None, 2.0, hw.tflops_bf16, kernel="cuBLAS BF16")
    return SpecDecodeConfig(method, k, draft, draft_quant, dict(spec))


def build_engine_config(hardware: str | HardwareSpec, model: str | ModelSpec,
                        serve_args: list[str] | tuple[str, ...] | ServeArgs | None = None,
                        ) -> EngineConfig:
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    args = serve_args if isinstance(serve_args, ServeArgs) else parse_serve_args(list(serve_args or []))
    if isinstance(model, ModelSpec):
        spec = model
    else:
        if args.model and not model:
            model = args.model
        spec = load_model(model)
    tp = args.tensor_parallel_size
    if spec.num_heads % tp:
        raise ServelabError(
            f"Total number of attention heads ({spec.num_heads}) must be divisible by tensor "
            f"parallel size ({tp}). (model {spec.hf_id}; pick another --tensor-parallel-size)"
        )
    quant, logs, warns = choose_quant_path(hw, spec, args.quantization, tp)
    logs = list(logs)
    if args.max_model_len is not None and args.max_model_len > spec.max_position_embeddings:
        raise ServelabError(
            f"User-specified max_model_len ({args.max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={spec.max_position_embeddings} or "
            f"model_max_length=None in model's config.json). This may lead to incorrect model outputs "
            f"or CUDA errors. To allow overriding this maximum, set the env var "
            f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    default_tokens, default_seqs = batch_defaults(hw)
    max_model_len = args.max_model_len or spec.max_position_embeddings
    max_tokens = args.max_num_batched_tokens or default_tokens
    max_seqs = args.max_num_seqs or default_seqs
    if max_tokens < max_seqs:
        raise ServelabError(
            f"max_num_batched_tokens ({max_tokens}) must be greater than or equal to max_num_seqs "
            f"({max_seqs}). (raise --max-num-batched-tokens or lower --max-num-seqs)"
        )
    custom_ar = tp > 1 and hw.link_type == "nvlink" and not args.disable_custom_all_reduce
    if tp > 1 and hw.link_type == "pcie" and not args.disable_custom_all_reduce:
        warns.append(CUSTOM_AR_WARNING)
    kv_dtype = args.kv_cache_dtype
    kv_bytes = 1.0 if kv_dtype.startswith("fp8") else 2.0
    speculative = parse_speculative(args.speculative_config, hw, spec) if args.speculative_config else None
    names = tuple(args.served_model_name) or (spec.hf_id,)
    offload_bytes = _offload_bytes(args, tp)
    lmcache = args.lmcache or {}
    return EngineConfig(
        hardware=hw, model=spec, served_model_names=names, quant=quant,
        tensor_parallel_size=tp, data_parallel_size=args.data_parallel_size,
        max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens, max_model_len=max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, kv_cache_dtype=kv_dtype,
        kv_dtype_bytes=kv_bytes, enforce_eager=args.enforce_eager, custom_all_reduce=custom_ar,
        speculative=speculative, serve_args=args,
        log_lines=tuple(logs + [f"WARNING {w}" for w in warns]), warnings=tuple(warns),
        kv_offload_bytes=offload_bytes, kv_offload_num_cpu_blocks=args.kv_offload_num_cpu_blocks,
        kv_offload_backend=args.kv_offloading_backend if offload_bytes else "native",
        lmcache_chunk_size=lmcache.get("lmcache.chunk_size", 256),
        lmcache_save_decode=lmcache.get("lmcache.save_decode_cache", False),
    )


def _offload_bytes(args: ServeArgs, tp: int) -> float:
    """CPU offloading as vLLM's config turns it on (``cpu_bytes_to_use = size x 2^30``; LMCache:
    ``max_local_cpu_size x 2^30`` on each TP rank), with the combinations the simulator does not
    model refused by name."""
    chunk = (args.lmcache or {}).get("lmcache.chunk_size", 256)
    if args.kv_offloading_backend == "lmcache" and chunk % args.block_size:
        raise ServelabError(
            f"serve args: LMCacheConnectorV1 lmcache.chunk_size {chunk} is not a multiple of "
            f"--block-size {args.block_size}: the simulator keys chunks by whole blocks; use a "
            f"multiple such as {args.block_size * 16}")
    if args.lmcache is not None:
        if args.kv_offloading_size is not None:
            raise ServelabError(
                "serve args: --kv-offloading-size with --kv-transfer-config LMCacheConnectorV1: "
                "give the size once, as kv_connector_extra_config lmcache.max_local_cpu_size "
                "(GiB per TP rank) or as --kv-offloading-size with --kv-offloading-backend lmcache")
        return args.lmcache.get("lmcache.max_local_cpu_size", 5.0) * tp * GIB
    if args.kv_offloading_size is None and args.kv_offload_num_cpu_blocks is None:
        return 0.0
    if args.kv_offloading_backend == "lmcache":
        # LMCache finds chunks by its own token hashes, so it works without vLLM's prefix cache.
        return args.kv_offloading_size * GIB
    if not args.enable_prefix_caching:
        raise ServelabError(
            "serve args: --kv-offloading-size with --no-enable-prefix-caching: the CPU tier is "
            "found by the prefix cache's block hashes; drop --no-enable-prefix-caching")
    return (args.kv_offloading_size or 0.0) * GIB


def build_kind_engine_config(hardware: str | HardwareSpec, model: str | ModelSpec, serve_args,
                             kind, gpu_mib: float | None = None) -> EngineConfig:
    """The engine configuration of a server ``kind`` (``specs.server_kinds``) given its own
    flags: the kind translates the settings the memory plan reads into vLLM's spelling (SGLang's
    defaults depend on the GPU's memory, ``gpu_mib``: the hardware file's when None) and sets
    the scheduling knobs where it differs."""
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    args = list(serve_args or [])
    config = build_engine_config(hw, model, kind.engine_serve_args(
        args, gpu_mib or hw.memory_mib))
    knobs = kind.scheduling(args) if kind.scheduling is not None else {}
    return replace(config, server_kind=kind.name, **knobs)
