"""SGLang as a server kind: ``python3 -m sglang.launch_server --model-path MODEL ARGS``.

Facts from SGLang's own source, release 0.5.21 (the PyPI wheel sglang-0.5.21; the image
``lmsysorg/sglang:v0.5.21``):
  - arg_groups/fields/{model,parallel,memory,schedule,spec,observability}.py: the flags and
    defaults (--tp-size alias --tensor-parallel-size, --dp-size, --pp-size, --context-length,
    --mem-fraction-static, --chunked-prefill-size, --max-running-requests, --enable-metrics off by
    default, --speculative-algorithm); arg_groups/choices.py: QUANTIZATION_CHOICES;
  - arg_groups/memory_hook.py handle_gpu_memory_settings: the --mem-fraction-static default
    (``mem_fraction_static_default`` below);
  - entrypoints/http_server.py: GET /health (503 while starting), GET|POST /flush_cache (empties
    the radix cache; 400 while requests are running), /v1/chat/completions, /v1/completions;
    /metrics is mounted only with --enable-metrics (utils/common.py add_prometheus_middleware);
  - SGLang's docker/compose.yaml (sgl-project/sglang at commit 0b082f520802) sets ``entrypoint:
    python3 -m sglang.launch_server``: the image runs no server by itself. The tag v0.5.21 is one
    users run (found in public deployment notes); 0.5.23 is the newest wheel on PyPI today.
  - scheduling, where it changes latency (``scheduling`` below; the simulator reads these):
    arg_groups/fields/schedule.py: --schedule-policy default "fcfs" (choices lpm, random, fcfs,
    dfs-weight, lof, priority, routing-key, hrrn), --enable-mixed-chunk off, --page-size None,
    resolved to 1 unless the attention backend needs larger pages (the backend hooks);
    managers/scheduler.py get_next_batch_to_run: a new prefill batch (get_new_batch_prefill)
    runs before the running decode batch, and joins it only with --enable-mixed-chunk
    (mix_with_running); managers/schedule_policy.py _determine_active_policy: lpm falls back
    to fcfs while more than 128 requests wait; model_runner.py: the default
    --max-running-requests. (schedule.py read at sgl-project/sglang commit 001b88623b1d, not
    in the 0.5.21 wheel itself: to be checked against it with the real-GPU captures.)
The log and /metrics grammar is ``log``; what the simulator writes in SGLang's words is ``sim_log``
and ``sim_metrics``.
"""
from __future__ import annotations

from servelab.specs.server_kinds.kind import ServerKind, SimDialect, is_model_ref, parse_flags
from servelab.specs.server_kinds.sglang import log as sglang_log
from servelab.specs.server_kinds.sglang import sim_log
from servelab.specs.server_kinds.sglang.sim_metrics import SglangMetrics

VERSION = "0.5.21"
# QUANTIZATION_CHOICES of 0.5.21 that name a method for a dense model servelab reasons about.
QUANTIZATION_METHODS = ("fp8", "w8a8_fp8", "modelopt_fp8", "awq", "awq_marlin", "gptq",
                        "gptq_marlin", "compressed-tensors", "bitsandbytes", "gguf", "w8a8_int8",
                        "moe_wna16", "mxfp4", "modelopt_fp4")
ALIASES = {"--model": "--model-path", "--tensor-parallel-size": "--tp-size",
           "--data-parallel-size": "--dp-size", "--pipeline-parallel-size": "--pp-size",
           # argparse takes a unique prefix; SGLang's own docs write --tp / --dp.
           "--tp": "--tp-size", "--dp": "--dp-size",
           "--speculative-draft-model": "--speculative-draft-model-path"}
RESERVED_FLAGS = ("--host", "--port", "--model-path")
SCHEDULE_POLICIES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key",
                     "hrrn")
SIMULATED_POLICIES = ("fcfs", "lpm")
SGLANG_MAX_RUNNING = 4096
# The simulator allocates pages smaller than this in blocks of this many tokens (matching stays
# per page): a block per token would cost the engine a block per decoded token.
SIM_PAGE_TOKENS = 16
INT_FLAGS = ("--tp-size", "--dp-size", "--pp-size", "--context-length", "--max-running-requests",
             "--max-total-tokens", "--max-prefill-tokens", "--speculative-num-steps",
             "--speculative-num-draft-tokens", "--speculative-eagle-topk", "--page-size")
# vLLM spellings a variant copied over by mistake -> SGLang's.
VLLM_SPELLINGS = {"--gpu-memory-utilization": "--mem-fraction-static",
                  "--max-model-len": "--context-length",
                  "--max-num-seqs": "--max-running-requests",
                  "--max-num-batched-tokens": "--chunked-prefill-size",
                  "--speculative-config": "--speculative-algorithm with --speculative-num-steps",
                  "--enable-prefix-caching": "nothing (RadixAttention is on unless "
                                             "--disable-radix-cache)"}
# memory_hook.py: (GPU memory below MiB, chunked_prefill_size, decode CUDA-graph max_bs at TP < 4,
# at TP >= 4); the last row is every larger GPU (B200, MI300).
_GPU_TIERS = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160),
              (90 * 1024, 8192, 256, 512), (160 * 1024, 8192, 256, 512),
              (float("inf"), 16384, 512, 512))


def flag_map(serve_args: list[str]) -> dict:
    """``['--tp', '2', '--enable-metrics']`` -> {'--tp-size': '2', '--enable-metrics': True}."""
    return parse_flags(serve_args, ALIASES, next_flag="--")


def _where(serve_args: list[str], flag: str) -> tuple:
    for i, token in enumerate(serve_args):
        head = token.split("=", 1)[0].replace("_", "-")
        if head == flag or ALIASES.get(head) == flag:
            return ("serve_args", i)
    return ("serve_args",)


def check_args(serve_args: list[str], args: dict, problem) -> None:
    """Refuse SGLang arguments that would not start or would mean something else."""
    for flag in RESERVED_FLAGS:
        if flag in args:
            problem(_where(serve_args, flag), flag, "no --host/--port/--model-path: servelab sets "
                    "where the server listens, and the model comes from `model`")
    for flag, fix in VLLM_SPELLINGS.items():
        if flag in args:
            problem(_where(serve_args, flag), flag, f"SGLang's spelling: {fix}")
    for flag in INT_FLAGS:
        value = args.get(flag)
        if value is not None and (not isinstance(value, str) or not value.isdigit()
                                  or int(value) < 1):
            problem(_where(serve_args, flag), f"{flag} {value}", f"{flag} followed by a whole "
                    f"number >= 1")
    chunked = args.get("--chunked-prefill-size")
    if chunked is not None and not (isinstance(chunked, str) and (
            chunked == "-1" or (chunked.isdigit() and int(chunked) > 0))):
        problem(_where(serve_args, "--chunked-prefill-size"), chunked,
                "a token count >= 1, or -1 to turn chunked prefill off (written "
                "--chunked-prefill-size=-1)")
    fraction = args.get("--mem-fraction-static")
    if fraction is not None:
        try:
            ok = 0 < float(fraction) < 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            problem(_where(serve_args, "--mem-fraction-static"), fraction,
                    "a fraction in (0, 1) of GPU memory for weights + KV cache, e.g. 0.85")
    quant = args.get("--quantization")
    if quant is not None and quant not in QUANTIZATION_METHODS:
        problem(_where(serve_args, "--quantization"), quant,
                "one of " + ", ".join(QUANTIZATION_METHODS))
    policy = args.get("--schedule-policy")
    if policy is not None and policy not in SCHEDULE_POLICIES:
        problem(_where(serve_args, "--schedule-policy"), policy,
                "one of " + ", ".join(SCHEDULE_POLICIES))
    algorithm = args.get("--speculative-algorithm")
    if algorithm is not None:
        if not isinstance(algorithm, str) or algorithm.upper() not in sglang_log.SPEC_ALGORITHMS:
            problem(_where(serve_args, "--speculative-algorithm"), algorithm,
                    "one of " + ", ".join(sglang_log.SPEC_ALGORITHMS))
        elif algorithm.upper() == "STANDALONE" and not is_model_ref(
                args.get("--speculative-draft-model-path")):
            problem(_where(serve_args, "--speculative-draft-model-path"),
                    args.get("--speculative-draft-model-path"),
                    "the draft model's Hugging Face id or local folder")


def speculative(args: dict) -> dict | None:
    """--speculative-algorithm in the claims' words; k is the draft tokens per step (NGRAM's
    --speculative-num-draft-tokens, the others' --speculative-num-steps), as the log reads it."""
    algorithm = args.get("--speculative-algorithm")
    if not isinstance(algorithm, str):
        return None
    method = sglang_log.SPEC_ALGORITHMS.get(algorithm.upper(), algorithm.lower())
    config: dict = {"method": method}
    k = args.get("--speculative-num-draft-tokens" if method == "ngram"
                 else "--speculative-num-steps")
    if isinstance(k, str) and k.isdigit():
        config["num_speculative_tokens"] = int(k)
    if isinstance(args.get("--speculative-draft-model-path"), str):
        config["model"] = args["--speculative-draft-model-path"]
    return config


def _tier(gpu_mib: float) -> tuple:
    return next(t for t in _GPU_TIERS if gpu_mib < t[0])


def mem_fraction_static_default(gpu_mib: float, tp: int = 1, pp: int = 1,
                                chunked_prefill_size: int | None = None,
                                max_running_requests: int | None = None) -> float:
    """SGLang 0.5.21's default --mem-fraction-static (memory_hook.handle_gpu_memory_settings):
    (GPU memory - reserved) / GPU memory, reserved in MiB = 512 + 1.5 x max(chunked prefill, 2048)
    + TP x PP / 8 x 1024 + 2 x the decode CUDA-graph max batch (capped by
    --max-running-requests), at least 10 GiB on GPUs over 60 GiB. Left out, as small: the prefill
    CUDA-graph reserve (8 MiB per captured size) and the multimodal, DP-attention and DeepEP
    terms, none of which apply to the dense text models servelab ships."""
    _, tier_chunk, bs_small_tp, bs_large_tp = _tier(gpu_mib)
    chunk = chunked_prefill_size or tier_chunk
    max_bs = bs_small_tp if tp < 4 else bs_large_tp
    if max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)
    reserved = 512 + max(chunk, 2048) * 1.5 + tp * pp / 8 * 1024 + max_bs * 2
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def _int(args: dict, flag: str) -> int | None:
    value = args.get(flag)
    return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else None


def engine_args(serve_args: list[str], gpu_mib: float | None) -> list[str]:
    """The settings the memory plan reads, in vLLM's spelling. --mem-fraction-static becomes
    --gpu-memory-utilization: both bound weights + KV cache, but vLLM's also holds the activations
    that SGLang reserves outside it, so the plan's KV estimate is a little low (verify compares
    it with the pool SGLang logs). SGLang-only knobs (attention backend, radix cache policy, ...)
    change speed, not this plan, and are left out."""
    args = flag_map(serve_args)
    tp, pp = _int(args, "--tp-size") or 1, _int(args, "--pp-size") or 1
    chunked, running = _int(args, "--chunked-prefill-size"), _int(args, "--max-running-requests")
    out: list[str] = []
    for flag, vllm_flag in (("--tp-size", "--tensor-parallel-size"),
                            ("--dp-size", "--data-parallel-size"),
                            ("--context-length", "--max-model-len"),
                            ("--max-running-requests", "--max-num-seqs")):
        if _int(args, flag) is not None:
            out += [vllm_flag, str(_int(args, flag))]
    if pp > 1:
        out += ["--pipeline-parallel-size", str(pp)]
    quant = args.get("--quantization")
    if quant in ("fp8", "w8a8_fp8", "modelopt_fp8"):
        out += ["--quantization", "fp8"]
    elif quant in ("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors"):
        out += ["--quantization", quant]
    kv_dtype = args.get("--kv-cache-dtype")
    if isinstance(kv_dtype, str) and kv_dtype.startswith("fp8"):
        out += ["--kv-cache-dtype", kv_dtype]
    if "--mem-fraction-static" in args:
        fraction = float(args["--mem-fraction-static"])
    elif gpu_mib:
        fraction = mem_fraction_static_default(gpu_mib, tp, pp, chunked if chunked and
                                               chunked > 0 else None, running)
    else:
        fraction = SGLANG_MEMORY_DEFAULT
    out += ["--gpu-memory-utilization", f"{fraction:g}"]
    if chunked is None and gpu_mib:
        chunked = _tier(gpu_mib)[1]
    if chunked is not None and chunked > 0:
        out += ["--max-num-batched-tokens", str(max(chunked, running or 0))]
    if "--disable-radix-cache" in args:
        out.append("--no-enable-prefix-caching")
    return out


def scheduling(serve_args: list[str]) -> dict:
    """SGLang's scheduling where it differs from vLLM's, as engine-config knobs: the radix
    cache matches prefixes token by token (page_size 1, vLLM: 16-token blocks), a prefill batch
    runs alone unless --enable-mixed-chunk, and --schedule-policy orders the waiting queue."""
    from servelab.core.errors import ServelabError

    args = flag_map(serve_args)
    policy = args.get("--schedule-policy", "fcfs")
    if policy not in SIMULATED_POLICIES:
        raise ServelabError(f"serve_args: --schedule-policy {policy}: the simulator models "
                            f"{' and '.join(SIMULATED_POLICIES)} (SGLang's default is fcfs)")
    # model_runner.py: max_num_reqs = min(max(pool tokens / context_len x 512, 2048), 4096); the
    # pool is sized later, so the upper end is taken (it holds from a pool of 8 contexts up).
    return {"block_size": _int(args, "--page-size") or 1,
            "kv_page_tokens": SIM_PAGE_TOKENS,
            "max_num_seqs": _int(args, "--max-running-requests") or SGLANG_MAX_RUNNING,
            "mixed_prefill_decode": "--enable-mixed-chunk" in args,
            "memory_fraction_holds_activations": False,
            "schedule_policy": policy}


# The rule's value on an 80 GB GPU (H100, A100) at TP 1, used only where the GPU is not known;
# preflight always knows it and applies the rule.
SGLANG_MEMORY_DEFAULT = mem_fraction_static_default(81559)

SGLANG = ServerKind(
    name="sglang", label="SGLang", command=("python3", "-m", "sglang.launch_server"),
    install_hint=f"pip install 'sglang[all]=={VERSION}' on a GPU host (its own CUDA wheels)",
    image=f"${{SGLANG_IMAGE:-lmsysorg/sglang:v{VERSION}}}",
    image_entrypoint=("python3", "-m", "sglang.launch_server"), compose_entrypoint=True,
    health_path="/health", reset_prefix_cache_path="/flush_cache", dev_env={},
    flags={"model": "--model-path", "host": "--host", "port": "--port",
           "tensor_parallel_size": "--tp-size", "pipeline_parallel_size": "--pp-size",
           "data_parallel_size": "--dp-size", "quantization": "--quantization",
           "max_model_len": "--context-length", "memory_utilization": "--mem-fraction-static",
           "speculative_config": "--speculative-algorithm"},
    flag_aliases=ALIASES, model_positional=False,
    memory_utilization_default=SGLANG_MEMORY_DEFAULT,
    memory_refusal="Not enough memory. Please try to increase --mem-fraction-static",
    metrics=sglang_log.METRICS, view_metrics=sglang_log.VIEW_METRICS, check_args=check_args,
    parse_log=sglang_log.parse_log,
    parse_metrics=sglang_log.parse_metrics, linear_path=sglang_log.linear_path,
    speculative=speculative, required_args=("--enable-metrics",), engine_args=engine_args,
    memory_from_free=True,  # mem_cache/kv_cache_configurator.py _profile_available_bytes
    scheduling=scheduling,
    sim_log=SimDialect(lambda config, plan, seed=0, version=None:
                       sim_log.startup_lines(config, plan, seed),
                       sim_log.format_line, sim_log.READY_LINE),
    sim_metrics=SglangMetrics,
)
