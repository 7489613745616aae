"""The whole matrix on the simulator: three variants, each a real `servelab sim` process measured
by the real runner (Locust in its own processes), verified, compared and reported, with output
fidelity alongside."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    from servelab.cli import main

    base = tmp_path_factory.mktemp("matrix")
    db, out = base / "m.duckdb", base / "report"
    # A10G: fp8 is refused by preflight (no native FP8) and run anyway with --force, so the
    # comparison must show that its numbers are not FP8's.
    code = main(["matrix", "--variants", "bf16,fp8,gptq_int4", "--profile",
                 str(DATA / "matrix_tiny.yaml"), "--backend", "sim", "--hardware", "A10G",
                 "--force", "--fidelity", str(DATA / "fidelity_tiny.jsonl"), "--db", str(db),
                 "--out", str(out), "--logs", str(base / "logs")])
    return code, db, out


@pytest.mark.slow
def test_matrix_measures_verifies_and_compares(matrix_run, capsys):
    code, db, out = matrix_run
    assert code == 0
    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT variant, status, flags, verification->>'status', tags['matrix'], "
                       "verification->'preflight'->>'status' FROM runs ORDER BY started_unix"
                       ).fetchall()
    assert [r[0] for r in runs] == ["bf16", "fp8", "gptq_int4"]
    assert {r[4] for r in runs} == {json.loads((out / "matrix.json").read_text())["matrix_id"]}
    by = {r[0]: r for r in runs}
    assert by["bf16"][3] == "verified" and by["gptq_int4"][3] == "verified"
    assert by["fp8"][3] == "mismatch" and "variant_mismatch" in by["fp8"][2]
    assert by["fp8"][5] == "refuse" and by["bf16"][5] == "ok"
    stages = con.execute("SELECT count(*) FROM stage_summary s JOIN runs r USING (run_id) "
                         "WHERE s.class_name = '(all)'").fetchone()[0]
    assert stages == 6
    fid = con.execute("SELECT candidate, count(*) FROM fidelity GROUP BY 1 ORDER BY 1").fetchall()
    assert fid == [("fp8", 4), ("gptq_int4", 4)]
    con.close()


@pytest.mark.slow
def test_matrix_table_and_report(matrix_run):
    _, _, out = matrix_run
    table = (out / "matrix.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}
    assert set(rows) == {"bf16", "fp8", "gptq_int4"}
    assert "| mismatch |" in rows["fp8"] and "| verified |" in rows["bf16"]
    assert "baseline" in rows["bf16"] and "%" in rows["gptq_int4"]
    assert "weight-only FP8 through Marlin" in table  # the note says why fp8 is not FP8 here
    data = json.loads((out / "matrix.json").read_text())
    speeds = {e["variant"]: e["speed"][-1]["output_tokens_per_s"] for e in data["entries"]}
    # Simulated A10G at 4 users: the int4 weights stream fastest.
    assert speeds["gptq_int4"] > speeds["bf16"]
    report = out / "report.html"
    assert report.is_file() and report.stat().st_size > 1000
    assert list(out.glob("*.png"))


def test_a_refused_variant_is_skipped_without_force(tmp_path, cli):
    code, out, _ = cli("matrix", "--variants", "fp8", "--profile", DATA / "matrix_tiny.yaml",
                       "--backend", "sim", "--hardware", "A10G", "--db", tmp_path / "x.duckdb",
                       "--out", tmp_path / "r")
    assert code == 1
    assert "skipped (preflight refused it" in out and "| fp8 | 1 | refused |" in out
    assert not (tmp_path / "x.duckdb").exists()  # nothing was measured


def test_predict_backend_runs_the_matrix_in_virtual_time(tmp_path, cli):
    code, out, err = cli("matrix", "--variants", "bf16,tp2,dp2", "--profile",
                         DATA / "tiny.yaml", "--backend", "predict", "--hardware", "H100",
                         "--db", tmp_path / "p.duckdb", "--out", tmp_path / "r", "--no-report")
    table = (tmp_path / "r" / "matrix.md").read_text()
    assert table.count("| predicted | predicted |") == 3
    # Virtual time is deterministic, so the verdict is too. TP2 splits each step's weight reads
    # over two H100s and leads on every judged figure at 1 and at 4 users (DP2's replicas only
    # halve the batch, which at 4 users hardly shortens a step). SLO attainment (all met) and
    # error rate (none) are ties, and a tie names no winner.
    assert "stage 0: tp2 wins every metric" in out and "stage 1: tp2 wins every metric" in out
    assert "tp2 wins every metric at every stage" in out.splitlines()
    assert "no variant wins every metric" not in out
    assert not (tmp_path / "r" / "report.html").exists()
    con = duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM runs WHERE list_contains(flags, 'predicted')"
                       ).fetchone()[0] == 3
    con.close()
    assert code == 0, err
