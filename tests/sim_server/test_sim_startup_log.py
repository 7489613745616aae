"""The simulator's start-up log is vLLM's: `servelab verify` reaches its verdict from the vLLM lines
alone (the engine config line, kernel selections, warnings, KV-cache lines)."""
import pytest

from servelab.orchestration.serverlog import parse_log
from servelab.orchestration.verify import verify
from servelab.sim.engine.kv_sizing import plan_kv_cache
from servelab.sim.server.server import resolve_config
from servelab.specs.server_kinds.vllm.sim_log import engine_config_line, format_line, startup_lines
from servelab.specs.variants import load_variant


def sim_log(tmp_path, variant, hardware, extra=()):
    config, _, _ = resolve_config(hardware, None, list(extra), variant=variant)
    lines = startup_lines(config, plan_kv_cache(config), seed=3)
    assert not any(line.startswith("servelab sim:") for line in lines)
    path = tmp_path / f"{variant}-{hardware}.log"
    path.write_text("\n".join(format_line(line) for line in lines) + "\n")
    return path, config


@pytest.mark.parametrize("variant, hardware, extra, status, check, words", [
    ("bf16", "L40S", (), "verified", "precision", "unquantized (torch.bfloat16)"),
    ("fp8", "L40S", (), "verified", "precision", "native FP8 W8A8 (CutlassFP8ScaledMMLinearKernel"),
    ("fp8", "A10G", (), "mismatch", "precision", "weight-only FP8 through Marlin (W8A16)"),
    ("gptq_int4", "L4", (), "verified", "precision",
     "W4A16 (MarlinLinearKernel for AutoGPTQLinearMethod)"),
    ("awq_int4", "L40S", (), "verified", "precision",
     "W4A16 (MarlinLinearKernel for AutoAWQMarlinLinearMethod)"),
    ("awq_int4", "L40S", ("--quantization", "awq"), "verified", "precision",
     "forces the slow kernel"),
    ("bf16", "L40S", ("--quantization", "fp8"), "mismatch", "precision",
     "claims bf16 but the server quantizes (quantization=fp8"),
    ("spec_ngram", "L40S", (), "verified", "speculative", "ngram, k=5"),
    ("spec_draft", "H100", (), "verified", "speculative", "draft_model, k=5"),
    ("spec_ngram", "L40S", ("--speculative-config", '{"method": "ngram", '
                            '"num_speculative_tokens": 3}'), "mismatch", "speculative",
     "claims k=5, server uses k=3"),
    ("dp2", "H100", (), "verified", "parallelism", "TP 1, DP 2"),
    ("tp2", "L40S", (), "verified", "parallelism", "custom all-reduce disabled"),
    ("tp2", "H100", (), "verified", "parallelism", "TP 2, DP 1"),
])
def test_verify_reads_a_simulator_log_like_a_vllm_log(tmp_path, variant, hardware, extra, status,
                                                      check, words):
    path, config = sim_log(tmp_path, variant, hardware, extra)
    verdict = verify(load_variant(variant, environ={}), path)
    found = {c.name: c for c in verdict.checks}
    assert verdict.status == status, verdict.summary()
    assert words in found[check].detail, verdict.summary()
    assert found["model"].status == "ok" and found["kv_cache"].status == "ok"
    assert verdict.facts["kv_cache_tokens"] == plan_kv_cache(config).kv_tokens


def test_the_engine_config_line_has_vllms_fields():
    config, _, _ = resolve_config("A10G", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
                                  ["--max-model-len", "4096", "--served-model-name", "a", "b",
                                   "--enforce-eager"])
    line = engine_config_line(config, seed=11, version="0.11.0")  # the oldest row's words
    assert line.startswith("Initializing a V1 LLM engine (v0.11.0+servelab.sim) with config: "
                           "model='Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4', speculative_config=None, "
                           "tokenizer='Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4', ")
    for field in ("dtype=torch.float16", "max_seq_len=4096", "tensor_parallel_size=1",
                  "pipeline_parallel_size=1", "data_parallel_size=1", "quantization=gptq_marlin",
                  "enforce_eager=True", "seed=11", "served_model_name=['a', 'b']",
                  "enable_prefix_caching=True", "kv_cache_dtype=auto"):
        assert f", {field}," in line, field
    facts = parse_log(format_line(line))
    assert facts.engine_config_seen and facts.vllm_version == "0.11.0+servelab.sim"
    assert (facts.quantization, facts.dtype, facts.tensor_parallel_size) == \
        ("gptq_marlin", "torch.float16", 1)
    bf16, _, _ = resolve_config("H100", None, ["--dtype", "half", "--speculative-config",
                                               '{"method": "eagle3", "model": "yuhuili/EAGLE3-'
                                               'LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}'])
    line = engine_config_line(bf16)
    assert ", dtype=torch.float16," in line and ", quantization=None," in line
    assert ("speculative_config=SpeculativeConfig(method='eagle3', model='yuhuili/EAGLE3-"
            "LLaMA3.1-Instruct-8B', num_spec_tokens=3)") in line


def test_kernel_lines_for_each_quantization_path():
    def lines(hardware, model, *flags):
        config, _, _ = resolve_config(hardware, model, ["--max-model-len", "4096", *flags])
        return startup_lines(config, plan_kv_cache(config), version="0.11.0")  # the oldest row

    gptq = lines("L40S", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4")
    assert "The model is convertible to gptq_marlin during runtime. Using gptq_marlin kernel." in gptq
    assert "Using MarlinLinearKernel for GPTQMarlinLinearMethod" in gptq
    awq = lines("L40S", "Qwen/Qwen3-14B-AWQ")
    assert "Using MarlinLinearKernel for AWQMarlinLinearMethod" in awq
    forced = lines("L40S", "Qwen/Qwen3-14B-AWQ", "--quantization", "awq")
    assert any(line.startswith("Detected that the model can run with awq_marlin, however you "
                               "specified quantization=awq explicitly, so forcing awq.")
               for line in forced)
    assert not any("MarlinLinearKernel" in line for line in forced)
    fp8 = lines("A10G", "Qwen/Qwen2.5-7B-Instruct", "--quantization", "fp8")
    assert "Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod" in fp8
    assert any(line.startswith("WARNING Your GPU does not have native support for FP8 computation")
               for line in fp8)
    assert "Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod" in lines(
        "L4", "Qwen/Qwen2.5-7B-Instruct", "--quantization", "fp8")
