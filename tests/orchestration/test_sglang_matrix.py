"""One matrix compares frameworks on the same traffic: bf16 (vLLM) beside sglang_bf16 (SGLang)
on the simulator's engine, predicted in virtual time and measured through real `servelab sim`
processes, each run read by the same views (SGLang's under its own metric names)."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

DATA = Path(__file__).resolve().parent / "data"


def _matrix(cli, tmp_path, backend: str):
    db, out = tmp_path / "m.duckdb", tmp_path / "out"
    code, stdout, _ = cli("matrix", "--variants", "bf16,sglang_bf16", "--profile",
                          DATA / "matrix_tiny.yaml", "--backend", backend, "--hardware", "L40S",
                          "--db", db, "--out", out, "--logs", tmp_path / "logs", "--no-report")
    assert code == 0, stdout[-3000:]
    rows = {line.split("|")[1].strip(): line for line in (out / "matrix.md").read_text()
            .splitlines() if line.startswith("| ") and not line.startswith("| variant")}
    assert set(rows) == {"bf16", "sglang_bf16"}
    return duckdb.connect(str(db), read_only=True), rows


def test_predicted_matrix_compares_vllm_and_sglang(cli, tmp_path):
    con, rows = _matrix(cli, tmp_path, "predict")
    assert all("| predicted |" in row for row in rows.values())
    names = dict(con.execute(
        "SELECT r.variant, list_sort(list_distinct(list(split_part(m.name, ':', 1)))) FROM "
        "server_metrics m JOIN runs r USING (run_id) GROUP BY 1").fetchall())
    assert names == {"bf16": ["vllm"], "sglang_bf16": ["sglang"]}
    kv = dict(con.execute("SELECT r.variant, max(t.kv_cache_usage) FROM server_timeline t "
                          "JOIN runs r USING (run_id) GROUP BY 1").fetchall())
    assert kv["bf16"] > 0 and kv["sglang_bf16"] > 0
    # Decodes wait out SGLang's prefill batches: a worse ITL tail at 4 users on equal traffic.
    itl = dict(con.execute(
        "SELECT r.variant, s.itl_p99_ms FROM stage_summary s JOIN runs r USING (run_id) "
        "WHERE s.class_name = '(all)' AND s.stage = 1").fetchall())
    assert itl["sglang_bf16"] > 1.5 * itl["bf16"]


@pytest.mark.slow
def test_measured_matrix_verifies_both_frameworks(cli, tmp_path):
    con, rows = _matrix(cli, tmp_path, "sim")
    assert all("| verified |" in row for row in rows.values())
    status = dict(con.execute("SELECT variant, verification->>'status' FROM runs").fetchall())
    assert status == {"bf16": "verified", "sglang_bf16": "verified"}
