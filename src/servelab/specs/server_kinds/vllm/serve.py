"""vLLM as a server kind: ``vllm serve MODEL ARGS``, the official image, its flags; the grammar
is ``log``, the releases ``versions``, the simulator's start-up log ``sim_log``.

The simulator speaks the same dialect (it reads these flags with ``specs.serve_args`` and writes a
vLLM-shaped log and ``/metrics``), so a variant with ``server: vllm`` runs on either.
"""
from __future__ import annotations

import json

from servelab.specs.serve_args import FLAG_ALIASES
from servelab.specs.server_kinds.kind import SPECULATIVE_METHODS, ServerKind, SimDialect, is_model_ref
from servelab.specs.server_kinds.vllm import log as vllm_log
from servelab.specs.server_kinds.vllm import sim_log
from servelab.specs.server_kinds.vllm import versions as vllm_versions

# vLLM's --quantization choices that servelab knows how to reason about; others are refused so a
# typo does not silently serve the unquantized model.
QUANTIZATION_METHODS = ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp4", "gptq",
                        "gptq_marlin", "gptq_bitblas", "awq", "awq_marlin", "marlin",
                        "compressed-tensors", "bitsandbytes", "gguf", "experts_int8", "moe_wna16",
                        "torchao", "quark", "mxfp4", "hqq", "inc")
# The orchestration owns where a server listens; a variant that pins them would collide.
RESERVED_FLAGS = ("--host", "--port", "--model")
INT_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
             "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--block-size")


def check_args(serve_args: list[str], args: dict, problem) -> None:
    """Refuse vLLM arguments that would not run or would mean something else; ``problem(field,
    found, allowed)`` records one, ``field`` locating the offending serve_args item."""
    def where(flag: str) -> tuple:
        for i, token in enumerate(serve_args):
            head = token.split("=", 1)[0]
            if head.replace("_", "-") == flag or FLAG_ALIASES.get(head) == flag:
                return ("serve_args", i)
        return ("serve_args",)

    for flag in RESERVED_FLAGS:
        if flag in args:
            problem(where(flag), flag, "no --host/--port/--model: servelab sets where the server "
                    "listens, and the model comes from `model`")
    for flag in INT_FLAGS:
        value = args.get(flag)
        if value is not None and (not isinstance(value, str) or not value.isdigit()
                                  or int(value) < 1):
            problem(where(flag), f"{flag} {value}", f"{flag} followed by a whole number >= 1")
    util = args.get("--gpu-memory-utilization")
    if util is not None:
        try:
            ok = 0 < float(util) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            problem(where("--gpu-memory-utilization"), util, "a fraction in (0, 1], e.g. 0.9")
    quant = args.get("--quantization")
    if quant is not None and quant not in QUANTIZATION_METHODS:
        problem(where("--quantization"), quant, "one of " + ", ".join(QUANTIZATION_METHODS))
    spec = args.get("--speculative-config")
    if spec is not None:
        _check_speculative(spec, where("--speculative-config"), problem)
    for flag in ("--speculative-model", "--num-speculative-tokens"):
        if flag in args:
            problem(where(flag), flag,
                    "--speculative-config JSON (vLLM removed the separate flags)")


def _check_speculative(spec, at: tuple, problem) -> None:
    try:
        config = json.loads(spec) if isinstance(spec, str) else None
    except json.JSONDecodeError as exc:
        config, reason = None, str(exc)
    else:
        reason = "a JSON object"
    if not isinstance(config, dict):
        problem(at, spec, f"JSON ({reason}), e.g. "
                '\'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}\'')
        return
    if config.get("method") not in SPECULATIVE_METHODS:
        problem(at, config.get("method"), "method one of " + ", ".join(SPECULATIVE_METHODS))
    k = config.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        problem(at, k, "num_speculative_tokens >= 1")
    if config.get("method") == "draft_model" and not is_model_ref(config.get("model")):
        problem(at, config.get("model"), "a draft model's Hugging Face id or local folder "
                "under \"model\"")


def speculative(args: dict) -> dict | None:
    """--speculative-config's JSON object (check_args has refused any that is not one)."""
    value = args.get("--speculative-config")
    return json.loads(value) if isinstance(value, str) else None


VLLM = ServerKind(
    name="vllm", label="vLLM", command=("vllm", "serve"),
    install_hint="pip install 'servelab[vllm]' on a GPU host",
    # The newest release servelab measured on a real GPU: a default nobody ran would be a guess.
    image="${VLLM_IMAGE:-vllm/vllm-openai:v" + vllm_versions.MEASURED_ON_H200[-1] + "}",
    image_entrypoint=("vllm", "serve"),  # the official image's ENTRYPOINT
    health_path="/health", reset_prefix_cache_path="/reset_prefix_cache",
    # Dev mode serves POST /reset_prefix_cache, so one variant's cache never favours the next run.
    dev_env={"VLLM_SERVER_DEV_MODE": "1"},
    flags={"model": "--model", "host": "--host", "port": "--port",
           "tensor_parallel_size": "--tensor-parallel-size",
           "pipeline_parallel_size": "--pipeline-parallel-size",
           "data_parallel_size": "--data-parallel-size", "quantization": "--quantization",
           "max_model_len": "--max-model-len", "memory_utilization": "--gpu-memory-utilization",
           "speculative_config": "--speculative-config"},
    flag_aliases=FLAG_ALIASES, model_positional=True,
    # vLLM 0.26 (captured log) through 0.33 (config/cache.py); serve_args.ServeArgs agrees
    memory_utilization_default=vllm_versions.release(vllm_versions.CURRENT).gpu_memory_utilization,
    memory_refusal="free memory on device is less than desired GPU memory utilization",
    metrics=vllm_log.METRICS, view_metrics=vllm_log.VIEW_METRICS, check_args=check_args,
    parse_log=vllm_log.parse_log,
    parse_metrics=vllm_log.parse_metrics, linear_path=vllm_log.linear_path,
    speculative=speculative,
    sim_log=SimDialect(sim_log.startup_lines, sim_log.format_line, None),
)
