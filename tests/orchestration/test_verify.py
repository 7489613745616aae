"""Verify on saved vLLM start-up logs and /metrics pages, and record the verdict on a run."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from servelab.orchestration.serverlog import parse_log, parse_metrics
from servelab.orchestration.verify import record, verify
from servelab.specs.variants import load_variant

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "servers" / "logs"
GPUS = REPO / "servers" / "gpus"


def test_log_facts():
    f = parse_log((LOGS / "a10g_fp8.log").read_text())
    assert f.fp8_marlin_fallback and f.kernels == ["MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"]
    assert f.quantization == "fp8" and f.kv_cache_tokens == 196_416
    assert (f.max_concurrency_len, f.max_concurrency) == (8192, 23.98)
    assert f.vllm_version == "0.11.0" and f.model == "Qwen/Qwen2.5-7B-Instruct"
    g = parse_log((LOGS / "l40s_gptq_int4.log").read_text())
    assert g.marlin_conversion == "gptq_marlin" and g.quantization == "gptq_marlin"
    s = parse_log((LOGS / "l40s_spec_ngram.log").read_text())
    assert s.speculative == {"method": "ngram", "num_speculative_tokens": 5}
    t = parse_log((LOGS / "l4x4_tp2.log").read_text())
    assert t.tensor_parallel_size == 2 and t.custom_allreduce_disabled
    # Newer vLLM merges the two KV lines into one.
    m = parse_log("(EngineCore_DP0 pid=9) INFO 01-02 03:04:05 [kv_cache_utils.py:1234] GPU KV cache "
                  "size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x")
    assert (m.kv_cache_tokens, m.max_concurrency) == (34_952, 4.27)


@pytest.mark.parametrize("variant, log, status, check, words", [
    ("bf16", "l40s_bf16.log", "verified", "precision", "unquantized"),
    ("fp8", "l40s_fp8.log", "verified", "precision", "native FP8 W8A8"),
    ("fp8", "a10g_fp8.log", "mismatch", "precision", "weight-only FP8 through Marlin (W8A16)"),
    ("gptq_int4", "l40s_gptq_int4.log", "verified", "precision", "W4A16 (gptq_marlin)"),
    ("awq_int4", "l40s_awq_forced.log", "verified", "precision", "forces the slow kernel"),
    ("tp2", "l4x4_tp2.log", "verified", "parallelism", "custom all-reduce disabled"),
    ("spec_ngram", "l40s_spec_ngram.log", "verified", "speculative", "ngram, k=5"),
    ("spec_draft", "l40s_spec_ngram.log", "mismatch", "speculative", "claims draft_model"),
    ("bf16", "l40s_fp8.log", "mismatch", "precision", "claims bf16 but the server quantizes"),
    ("bf16", "a10g_llama_bf16_too_long.log", "failed_to_start", "startup",
     "To serve at least one request with the models's max seq len (131072)"),
])
def test_verdicts_on_saved_logs(variant, log, status, check, words):
    verdict = verify(load_variant(variant, environ={}), LOGS / log)
    found = {c.name: c for c in verdict.checks}
    assert verdict.status == status, verdict.summary()
    assert words in found[check].detail, verdict.summary()


def test_a_truncated_log_is_unverified(tmp_path):
    lines = (LOGS / "l40s_fp8.log").read_text().splitlines()
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(lines[:4]) + "\n")  # captured before the engine started
    verdict = verify(load_variant("fp8", environ={}), cut)
    assert verdict.status == "unverified" and verdict.flags == ["unverified"]


def test_metrics_confirm_speculation_and_engines():
    f = parse_metrics((LOGS / "l40s_spec_ngram.metrics").read_text())
    assert f.spec_decode_metrics and f.cache_config["num_gpu_blocks"] == "28028"
    assert f.kv_cache_tokens == 28028 * 16
    verdict = verify(load_variant("spec_ngram", environ={}), LOGS / "l40s_spec_ngram.log",
                     metrics_path=LOGS / "l40s_spec_ngram.metrics")
    assert verdict.status == "verified"
    # /metrics alone: two engines confirm DP 2, but nothing says what precision runs.
    dp2 = verify(load_variant("dp2", environ={}), metrics_path=LOGS / "h100x2_dp2.metrics")
    assert {c.name: c.status for c in dp2.checks}["parallelism"] == "ok"
    assert dp2.status == "unverified"
    assert verify(load_variant("spec_draft", environ={}),
                  metrics_path=LOGS / "h100x2_dp2.metrics").status == "mismatch"


def _db_with_run(path: Path, run_id: str) -> None:
    con = duckdb.connect(str(path))
    con.execute((REPO / "src/servelab/store/schema.sql").read_text())
    con.execute("INSERT INTO runs (run_id, variant, flags) VALUES (?, 'fp8', ['generator_saturated'])",
                [run_id])
    con.close()


def test_verdict_is_recorded_on_the_run(tmp_path, cli):
    db = tmp_path / "runs.duckdb"
    _db_with_run(db, "r1")
    code, out, _ = cli("verify", "fp8", "--log", LOGS / "a10g_fp8.log", "--gpus",
                       GPUS / "a10g.csv", "--db", db, "--run", "r1")
    assert code == 1 and "MISMATCH" in out and "preflight estimated" in out
    con = duckdb.connect(str(db))
    verification, flags = con.execute("SELECT verification, flags FROM runs").fetchone()
    con.close()
    data = json.loads(verification)
    assert data["status"] == "mismatch" and data["facts"]["fp8_marlin_fallback"] is True
    assert sorted(flags) == ["generator_saturated", "variant_mismatch"]
    # Verifying again with the right evidence replaces the verdict and its flag.
    verdict = verify(load_variant("fp8", environ={}), LOGS / "l40s_fp8.log")
    record(db, "r1", verdict)
    con = duckdb.connect(str(db))
    assert con.execute("SELECT flags FROM runs").fetchone()[0] == ["generator_saturated"]
    con.close()
    code, _, err = cli("verify", "fp8", "--log", LOGS / "l40s_fp8.log", "--db", db, "--run", "nope")
    assert code == 2 and "no run 'nope'" in err
