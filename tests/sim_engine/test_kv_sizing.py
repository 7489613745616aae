"""Start-up KV sizing against the table in vllm_behaviour.md, and vLLM's start-up lines/errors."""
import re

import pytest

from servelab.core.errors import ServelabError
from servelab.sim.engine import Engine, EngineStartupError, build_engine_config, preflight

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("hardware, args, table_tokens, tolerance", [
    ("H100", ["--max-model-len", "8192"], 441_000, 0.03),
    ("H200", ["--max-model-len", "8192"], 887_000, 0.03),
    ("L40S", ["--max-model-len", "8192"], 193_000, 0.05),
    ("H100", ["--max-model-len", "8192", "--quantization", "fp8"], 494_000, 0.03),
    ("L40S", ["--max-model-len", "8192", "--quantization", "fp8"], 246_000, 0.05),
    ("L4", ["--max-model-len", "8192", "--quantization", "fp8"], 81_000, 0.08),
])
def test_llama8b_kv_capacity_matches_the_reference_table(hardware, args, table_tokens, tolerance):
    # The reference table was measured at vLLM's old default utilization, 0.9 (0.26's is 0.92).
    plan = preflight(hardware, LLAMA, args + ["--gpu-memory-utilization", "0.9"])
    assert plan.ok
    assert plan.kv_tokens == pytest.approx(table_tokens, rel=tolerance)
    assert plan.kv_bytes_per_token == 128 * 1024
    assert plan.kv_tokens % 16 == 0 and plan.num_blocks * 16 == plan.kv_tokens


def test_weights_per_precision():
    assert preflight("H100", LLAMA, ["--max-model-len", "8192"]).weights_gib == pytest.approx(14.96, abs=0.01)
    assert preflight("H100", LLAMA, ["--max-model-len", "8192", "--quantization", "fp8"]).weights_gib == pytest.approx(8.5, abs=0.1)
    tp2 = preflight("H100", LLAMA, ["--max-model-len", "8192", "-tp", "2"])
    assert tp2.weights_gib == pytest.approx(14.96 / 2, abs=0.01) and tp2.kv_bytes_per_token == 64 * 1024
    # One copy of the weights over two GPUs leaves more KV than two copies would (2M - W vs 2(M - W)).
    assert tp2.kv_tokens > 2 * preflight("H100", LLAMA, ["--max-model-len", "8192"]).kv_tokens


def test_l4_default_max_model_len_fails_with_vllms_message():
    plan = preflight("L4", LLAMA, [])
    assert not plan.ok
    msg = plan.errors[0]
    m = re.fullmatch(
        r"To serve at least one request with the model's max seq len \(131072\), \(16\.00 GiB KV cache is "
        r"needed, which is larger than the available KV cache memory \((\d+\.\d\d) GiB\)\. Based on the "
        r"available memory, the estimated maximum model length is (\d+)\. Try increasing "
        r"gpu_memory_utilization or decreasing max_model_len when initializing the engine\.", msg)
    assert m, msg
    available, est = float(m.group(1)), int(m.group(2))
    assert 3.0 < available < 4.5 and est % 16 == 0
    assert est == pytest.approx(available * 2**30 / (128 * 1024), rel=0.01)
    cfg = build_engine_config("L4", LLAMA, [])
    with pytest.raises(EngineStartupError, match="estimated maximum model length"):
        Engine(cfg)
    # The estimate is a length that does start.
    assert preflight("L4", LLAMA, ["--max-model-len", str(est)]).ok
    assert not preflight("L4", LLAMA, ["--max-model-len", str(est + 16)]).ok


def test_model_that_does_not_fit_is_refused():
    plan = preflight("L4", "Qwen/Qwen3-14B", ["--max-model-len", "4096"])
    assert not plan.ok and "CUDA out of memory" in plan.errors[0] and "Qwen/Qwen3-14B" in plan.errors[0]
    low = preflight("A10G", "Qwen/Qwen2.5-7B-Instruct", ["--max-model-len", "4096", "--gpu-memory-utilization", "0.6"])
    assert low.errors == ["No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                          "when initializing the engine."]
    # Quantized, the same model fits and keeps room for KV.
    assert preflight("L4", "Qwen/Qwen3-14B-AWQ", ["--max-model-len", "4096"]).ok


def test_startup_log_lines():
    # The wording is the imitated release's (vLLM 0.33 by default): the figures are what is pinned.
    engine = Engine(build_engine_config("H100", LLAMA, []))
    log = engine.startup_log
    assert log[0] == ("vLLM server version 0.33.0+servelab.sim, serving model "
                      "meta-llama/Llama-3.1-8B-Instruct")
    assert "Using max model len 131072" in log
    assert "Chunked prefill is enabled with max_num_batched_tokens=8192." in log
    (init,) = [line for line in log if line.startswith("Initializing a V1 LLM engine")]
    assert init.startswith("Initializing a V1 LLM engine (v0.33.0+servelab.sim) with config: "
                           "model='meta-llama/Llama-3.1-8B-Instruct'")
    text = "\n".join(log)
    assert re.search(r"^Model loading took 14\.95\d\d GiB memory and \d+\.\d{6} seconds$", text, re.M)
    assert re.search(r"^Available KV cache memory: 5\d\.\d\d GiB$", text, re.M)
    assert re.search(r"^GPU KV cache size: 4\d\d,\d\d\d tokens, Maximum concurrency for 131,072 "
                     r"tokens per request: 3\.\d\dx$", text, re.M)
    fp8 = Engine(build_engine_config("A10G", "Qwen/Qwen2.5-7B-Instruct", ["--quantization", "fp8", "--max-model-len", "4096"]))
    assert any(line.startswith("WARNING Your GPU does not have native support for FP8") for line in fp8.startup_log)


def test_preflight_numbers_for_a_quantized_14b_on_l40s():
    bf16 = preflight("L40S", "Qwen/Qwen3-14B", ["--max-model-len", "8192"])
    awq = preflight("L40S", "Qwen/Qwen3-14B-AWQ", ["--max-model-len", "8192"])
    assert bf16.kv_bytes_per_token == awq.kv_bytes_per_token == 160 * 1024
    assert awq.kv_tokens > 2.4 * bf16.kv_tokens
    assert bf16.concurrency_at(2048) == pytest.approx(bf16.num_blocks / 128)
    assert awq.max_concurrency > 20 > bf16.max_concurrency > 8


def test_kv_cache_memory_bytes_reserves_exactly_that():
    fixed = preflight("H200", "Qwen/Qwen2.5-7B-Instruct", ["--kv-cache-memory-bytes", "20G"])
    # vLLM 0.26 on the H200 with the same flag: "GPU KV cache size: 374,480 tokens"
    # (servers/calibration/probes/h200_20261201/bf16_vllm.log).
    assert fixed.kv_tokens == 374_480 and not fixed.errors
    assert any("skipped memory profiling" in line for line in fixed.log_lines)
    decimal = preflight("H200", "Qwen/Qwen2.5-7B-Instruct", ["--kv-cache-memory-bytes", "21.5g"])
    assert decimal.available_kv_gib == pytest.approx(21.5e9 / 2**30)
    assert preflight("H200", "Qwen/Qwen2.5-7B-Instruct",
                     ["--kv-cache-memory-bytes", "200G"]).errors[0].startswith("torch.OutOfMemory")
    with pytest.raises(ServelabError, match="--kv-cache-memory-bytes: found '1.5G'"):
        preflight("H200", "Qwen/Qwen2.5-7B-Instruct", ["--kv-cache-memory-bytes", "1.5G"])
