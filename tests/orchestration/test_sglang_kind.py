"""SGLang as a server kind: its command line, its flags (and the vLLM spellings it refuses), the
--mem-fraction-static rule of SGLang 0.5.21's memory_hook.py, and preflight applying it."""
from __future__ import annotations

import dataclasses

import pytest

from servelab.orchestration.preflight import gpus_from_hardware, run_preflight
from servelab.specs.server_kinds import SGLANG, server_kind
from servelab.specs.server_kinds.sglang.serve import (engine_args, mem_fraction_static_default,
                                                      speculative)
from servelab.specs.serve_args import parse_serve_args
from servelab.specs.variants import VariantError, load_variant


def _variant(tmp_path, serve_args: str, claims: str = "weights: bf16, activations: bf16, "
             "min_compute_capability: 8.0, speculative: null", gpus: int = 1):
    path = tmp_path / "mine.yaml"
    path.write_text(f"name: mine\ndescription: an SGLang variant\nserver: sglang\n"
                    f"model: Qwen/Qwen2.5-7B-Instruct\nserve_args: {serve_args}\ngpus: {gpus}\n"
                    f"claims: {{{claims}}}\n")
    return path


def test_the_command_line_is_sglangs_with_metrics_on():
    v = load_variant("sglang_bf16", environ={})
    assert v.kind is server_kind("sglang") is SGLANG
    assert v.kind.command == ("python3", "-m", "sglang.launch_server")
    # The model is a flag; servelab adds --enable-metrics (off by default in SGLang) once.
    assert v.server_args(port=9, host="127.0.0.1") == [
        "--model-path", "Qwen/Qwen2.5-7B-Instruct", "--context-length", "8192",
        "--enable-metrics", "--host", "127.0.0.1", "--port", "9"]
    assert v.max_model_len == 8192 and v.tensor_parallel_size == 1
    assert load_variant("sglang_fp8").quantization == "fp8"
    assert SGLANG.image == "${SGLANG_IMAGE:-lmsysorg/sglang:v0.5.21}"
    assert SGLANG.health_path == "/health" and SGLANG.reset_prefix_cache_path == "/flush_cache"
    assert SGLANG.container_command("m", ["--enable-metrics"], 8000) == [
        "--model-path", "m", "--enable-metrics", "--host", "0.0.0.0", "--port", "8000"]


def test_parallel_sizes_accept_sglangs_aliases(tmp_path):
    v = load_variant(_variant(tmp_path, "['--tp', '2', '--dp-size', '2']", gpus=4))
    assert (v.tensor_parallel_size, v.data_parallel_size, v.gpus) == (2, 2, 4)
    v = load_variant(_variant(tmp_path, "['--tensor-parallel-size=2']", gpus=2))
    assert v.tensor_parallel_size == 2
    with pytest.raises(VariantError, match=r"gpus: found 1; allowed 2 = tensor"):
        load_variant(_variant(tmp_path, "['--tp-size', '2']"))


@pytest.mark.parametrize("args, field, words", [
    ("['--gpu-memory-utilization', '0.9']", "serve_args[0]", "SGLang's spelling: "
     "--mem-fraction-static"),
    ("['--max-model-len', '4096']", "serve_args[0]", "--context-length"),
    ("['--max-num-seqs', '64']", "serve_args[0]", "--max-running-requests"),
    ("['--port', '30000']", "serve_args[0]", "servelab sets where the server listens"),
    ("['--model-path', 'x/y']", "serve_args[0]", "the model comes from `model`"),
    ("['--mem-fraction-static', '1.2']", "serve_args[0]", "a fraction in (0, 1)"),
    ("['--quantization', 'fp9']", "serve_args[0]", "one of fp8, w8a8_fp8"),
    ("['--tp-size', 'two']", "serve_args[0]", "a whole number >= 1"),
    ("['--speculative-algorithm', 'MAGIC']", "serve_args[0]", "one of NGRAM, EAGLE"),
])
def test_bad_sglang_arguments_say_where_and_the_fix(tmp_path, args, field, words):
    path = _variant(tmp_path, args)
    with pytest.raises(VariantError) as err:
        load_variant(path)
    message = str(err.value)
    assert f"{path}:5: {field}: found" in message and words in message, message


def test_claims_must_match_the_quantization(tmp_path):
    with pytest.raises(VariantError, match=r"claims.weights: found 'bf16'; allowed 'fp8' "
                                           r"\(serve_args ask for --quantization fp8\)"):
        load_variant(_variant(tmp_path, "['--quantization', 'fp8']"))


def test_speculative_algorithms_map_to_the_claims_words(tmp_path):
    assert speculative({"--speculative-algorithm": "NGRAM",
                        "--speculative-num-draft-tokens": "4"}) == {
        "method": "ngram", "num_speculative_tokens": 4}
    assert speculative({"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": "3",
                        "--speculative-draft-model-path": "a/b"}) == {
        "method": "eagle3", "num_speculative_tokens": 3, "model": "a/b"}
    v = load_variant(_variant(tmp_path, "['--speculative-algorithm', 'NGRAM', "
                              "'--speculative-num-draft-tokens', '4']",
                              "weights: bf16, activations: bf16, min_compute_capability: 8.0, "
                              "speculative: ngram"))
    assert v.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}


@pytest.mark.parametrize("gpu_mib, tp, expected", [
    # (GPU memory - reserved) / GPU memory, reserved MiB = 512 + 1.5 x chunked prefill (tier's
    # default) + TP/8 x 1024 + 2 x decode CUDA-graph max batch, >= 10 GiB above 60 GiB.
    (23034, 1, round((23034 - (512 + 4096 * 1.5 + 128 + 48 * 2)) / 23034, 3)),    # L4: 0.701
    (46068, 1, round((46068 - (512 + 4096 * 1.5 + 128 + 32 * 2)) / 46068, 3)),    # L40S: 0.851
    (81559, 1, round((81559 - (512 + 8192 * 1.5 + 128 + 256 * 2)) / 81559, 3)),   # H100: 0.835
    (81559, 4, round((81559 - (512 + 8192 * 1.5 + 512 + 512 * 2)) / 81559, 3)),
    (143771, 1, round((143771 - 13440) / 143771, 3)),                              # H200: 0.907
    (16384, 1, round((16384 - (512 + 2048 * 1.5 + 128 + 8 * 2)) / 16384, 3)),     # T4
])
def test_the_mem_fraction_static_default_follows_sglangs_rule(gpu_mib, tp, expected):
    assert mem_fraction_static_default(gpu_mib, tp) == expected
    assert (mem_fraction_static_default(23034), mem_fraction_static_default(81559)) == (0.701,
                                                                                         0.835)


def test_engine_args_spell_the_same_settings_the_vllm_way():
    args = engine_args(["--tp", "2", "--quantization", "fp8", "--context-length", "8192",
                        "--max-running-requests", "64", "--disable-radix-cache"], 81559)
    assert args == ["--tensor-parallel-size", "2", "--max-model-len", "8192", "--max-num-seqs",
                    "64", "--quantization", "fp8", "--gpu-memory-utilization",
                    f"{mem_fraction_static_default(81559, 2, max_running_requests=64):g}",
                    "--max-num-batched-tokens", "8192", "--no-enable-prefix-caching"]
    parsed = parse_serve_args(args)
    assert parsed.tensor_parallel_size == 2 and parsed.enable_prefix_caching is False
    # An explicit fraction wins; chunked prefill turned off (-1) sets no token budget.
    args = engine_args(["--mem-fraction-static", "0.7", "--chunked-prefill-size=-1"], 81559)
    assert args == ["--gpu-memory-utilization", "0.7"]


def test_preflight_applies_the_fraction_of_the_gpu_it_runs_on():
    h100 = run_preflight(load_variant("sglang_bf16", environ={}), gpus_from_hardware("H100", 1),
                         "test")
    assert h100.status == "ok", h100.render()
    # KV = 81,559 MiB x 0.835 - weights, at 56 KiB per token (Qwen2.5-7B): about 0.98 M tokens,
    # the pool SGLang logs in the written start-up log (969,279) within 2 %.
    assert 0.98 < h100.kv_tokens / 969_279 < 1.03, h100.kv_tokens
    l4 = run_preflight(load_variant("sglang_bf16", environ={}), gpus_from_hardware("L4", 1), "t")
    assert l4.status == "ok" and l4.kv_tokens < h100.kv_tokens / 20   # 0.701 of 22.5 GiB
    fp8 = run_preflight(load_variant("sglang_fp8", environ={}), gpus_from_hardware("A100-80G", 1),
                        "test")
    assert fp8.refused and "SGLang would start without an error" in fp8.render()


def test_memory_in_use_shrinks_sglangs_pool_instead_of_refusing():
    gpu = gpus_from_hardware("H100", 1)[0]
    busy = run_preflight(load_variant("sglang_bf16", environ={}),
                         [dataclasses.replace(gpu, memory_used_mib=20_000)], "nvidia-smi")
    assert busy.status == "warn" and "sizes its KV cache from free memory" in busy.render()
    full = run_preflight(load_variant("sglang_bf16", environ={}),
                         [dataclasses.replace(gpu, memory_used_mib=70_000)], "nvidia-smi")
    assert full.refused and "--mem-fraction-static" in full.render()
