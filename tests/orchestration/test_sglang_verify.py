"""verify on SGLang's start-up log and /metrics, from the WRITTEN fixtures in data/sglang/ (written
from SGLang 0.5.21's source until a real GPU run can capture them)."""
from __future__ import annotations

from pathlib import Path

import pytest

from servelab.orchestration.serverlog import parse_log, parse_metrics
from servelab.orchestration.verify import verify
from servelab.specs.variants import load_variant

DATA = Path(__file__).parent / "data" / "sglang"


def test_every_fixture_says_it_was_written_not_captured():
    for path in DATA.glob("*.log"):
        assert path.read_text().startswith("# WRITTEN from SGLang 0.5.21's source"), path
    assert (DATA / "metrics_bf16.txt").read_text().startswith("# WRITTEN from SGLang 0.5.21")
    assert "WRITTEN, not captured" in (DATA / "README.md").read_text()


def test_the_start_up_log_is_read_into_facts():
    facts = parse_log((DATA / "startup_bf16.log").read_text(), server="sglang")
    assert facts.engine_config_seen and facts.startup_complete
    assert facts.model == "Qwen/Qwen2.5-7B-Instruct" and facts.quantization is None
    assert (facts.tensor_parallel_size, facts.data_parallel_size) == (1, 1)
    assert facts.speculative_seen and facts.speculative is None
    assert facts.attention_backend == "fa3" and facts.kv_cache_dtype == "torch.bfloat16"
    assert facts.kv_cache_tokens == 969_279 and facts.available_kv_gib == 51.76
    assert facts.model_weights_gib == 14.25 and facts.max_num_batched_tokens == 8192
    assert facts.errors == [] and facts.kernels == []


def test_metrics_confirm_the_model_the_engines_and_the_pool():
    facts = parse_metrics((DATA / "metrics_bf16.txt").read_text(), server="sglang")
    assert facts.metrics_seen and facts.metric_model_name == "Qwen/Qwen2.5-7B-Instruct"
    assert facts.engines == ["0"] and facts.kv_cache_tokens == 969_279
    assert facts.spec_decode_metrics is False   # spec_accept_length is 0: nothing verified


def test_bf16_and_native_fp8_are_verified():
    bf16 = verify(load_variant("sglang_bf16", environ={}), log_path=DATA / "startup_bf16.log",
                  metrics_path=DATA / "metrics_bf16.txt")
    assert bf16.status == "verified", bf16.summary()
    fp8 = verify(load_variant("sglang_fp8", environ={}), log_path=DATA / "startup_fp8.log")
    assert fp8.status == "verified", fp8.summary()
    precision = next(c for c in fp8.checks if c.name == "precision")
    assert "native FP8 W8A8" in precision.detail
    assert "no Marlin fallback warning" in precision.detail


@pytest.mark.parametrize("variant, log, words", [
    # fp8 claimed, the server loaded the model unquantized (server_args quantization=None).
    ("sglang_fp8", "startup_bf16.log", "claims FP8 but quantization=None"),
    # fp8 on an A100: SGLang falls back to weight-only FP8 through Marlin and says so once.
    ("sglang_fp8", "startup_fp8_a100.log", "weight-only FP8 through Marlin (W8A16)"),
    ("sglang_bf16", "startup_fp8.log", "claims bf16 but the server quantizes (quantization=fp8"),
])
def test_a_server_running_something_else_is_a_mismatch(variant, log, words):
    verdict = verify(load_variant(variant, environ={}), log_path=DATA / log)
    assert verdict.status == "mismatch", verdict.summary()
    assert words in next(c for c in verdict.checks if c.name == "precision").detail


def test_a_start_that_failed_reports_sglangs_own_error():
    verdict = verify(load_variant("sglang_bf16", environ={}), log_path=DATA / "startup_oom.log")
    assert verdict.status == "failed_to_start"
    assert verdict.checks[0].detail.startswith("RuntimeError: Not enough memory. Please try to "
                                               "increase --mem-fraction-static")


def test_a_truncated_log_cannot_prove_native_fp8():
    """Without the ready line, the Marlin warning might still have been coming."""
    text = (DATA / "startup_fp8.log").read_text()
    head = text[:text.index("[2026-10-01 10:00:21]")]
    facts = parse_log(head, server="sglang")
    assert facts.quantization == "fp8" and facts.kernels == [] and not facts.startup_complete


def test_data_parallel_ranks_and_speculative_settings_from_the_log():
    log = ("[2026-10-01 09:00:00] server_args={'model_path': 'Qwen/Qwen2.5-7B-Instruct', "
           "'quantization': None, 'tp_size': 2, 'dp_size': 2, 'speculative_algorithm': 'EAGLE', "
           "'speculative_draft_model_path': 'yuhuili/EAGLE-Qwen2-7B-Instruct', "
           "'speculative_num_steps': 3, 'speculative_eagle_topk': 1, "
           "'speculative_num_draft_tokens': 4}\n"
           "[2026-10-01 09:00:20 DP0 TP0] KV Cache is allocated. dtype: torch.bfloat16, "
           "#tokens: 500000, KV size: 26.70 GB\n"
           "[2026-10-01 09:00:20 DP1 TP0] KV Cache is allocated. dtype: torch.bfloat16, "
           "#tokens: 500000, KV size: 26.70 GB\n")
    facts = parse_log(log, server="sglang")
    assert (facts.tensor_parallel_size, facts.data_parallel_size) == (2, 2)
    assert facts.speculative == {"method": "eagle", "num_speculative_tokens": 3,
                                 "model": "yuhuili/EAGLE-Qwen2-7B-Instruct"}
    assert facts.available_kv_gib == 26.7


def test_sglang_not_installed_is_the_start_up_error():
    log = ("/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' "
           "(ModuleNotFoundError: No module named 'sglang')\n")
    facts = parse_log(log, server="sglang")
    assert facts.errors == ["ModuleNotFoundError: No module named 'sglang'"]
