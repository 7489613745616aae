"""The analysis commands through servelab's real entry point (cli.main)."""
import csv
import io
import json

import pytest


def test_runs_lists_runs_with_flags(cli, known_db, capsys):
    assert cli(["runs", "--db", str(known_db)]) == 0
    out = capsys.readouterr().out
    assert "k1-closed" in out and "k2-open" in out
    assert "rows_lost" in out and "unverified" in out


def test_summary_by_prefix_and_latest(cli, known_db, capsys):
    assert cli(["summary", "k1", "--db", str(known_db)]) == 0
    out = capsys.readouterr().out
    assert "175.0" in out and "392.5" in out  # stage 0 chat TTFT p50 / p99
    assert "flag unverified" in out and "http_500: 1" in out
    assert cli(["summary", "latest", "--db", str(known_db)]) == 0
    out = capsys.readouterr().out
    assert "k2-open" in out and "send lag p99" in out


def test_unknown_run_and_missing_db_exit_2(cli, known_db, tmp_path, capsys):
    assert cli(["summary", "nope", "--db", str(known_db)]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert cli(["runs", "--db", str(tmp_path / "missing.duckdb")]) == 2
    assert "no database at" in capsys.readouterr().err


def test_sql_formats(cli, known_db, tmp_path, capsys):
    query = ("SELECT stage, class_name, ttft_p50_ms, ttft_p99_adj_ms, errors_by_kind FROM stage_summary "
             "WHERE run_id = 'k1-closed' AND stage = 0 AND class_name = 'chat'")
    assert cli(["sql", query, "--db", str(known_db), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"stage": 0, "class_name": "chat", "ttft_p50_ms": pytest.approx(175.0),
                     "ttft_p99_adj_ms": "inf", "errors_by_kind": {"http_500": 1, "stream_cut": 1}}]
    assert cli(["sql", query, "--db", str(known_db), "--format", "csv"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0] == ["stage", "class_name", "ttft_p50_ms", "ttft_p99_adj_ms", "errors_by_kind"]
    assert float(table[1][2]) == pytest.approx(175.0)
    sql_file = tmp_path / "q.sql"
    sql_file.write_text("SELECT count(*) AS n FROM itl_tokens WHERE request_id = 'a2';")
    assert cli(["sql", "-f", str(sql_file), "--db", str(known_db), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 6}]
    assert cli(["sql", "SELECT 1", "--db", str(known_db)]) == 0
    assert "1 rows" in capsys.readouterr().out


def test_sql_errors_exit_2(cli, known_db, capsys):
    assert cli(["sql", "SELECT nope FROM stage_summary", "--db", str(known_db)]) == 2
    assert "nope" in capsys.readouterr().err
    assert cli(["sql", "DELETE FROM runs", "--db", str(known_db)]) == 2
    assert "read-only" in capsys.readouterr().err
    assert cli(["sql", "--db", str(known_db)]) == 2


def test_compare_variants(cli, synthetic_db, capsys):
    assert cli(["compare", "--variants", "fp8,gptq_int4", "--db", str(synthetic_db), "--boot", "100"]) == 0
    out = capsys.readouterr().out
    assert "fp8: runs syn-fp8-a, syn-fp8-b (repeats)" in out
    assert "stage 4:" in out and "no variant wins every metric" in out
    assert cli(["compare", "--db", str(synthetic_db)]) == 2
    assert "either run ids" in capsys.readouterr().err
    assert cli(["compare", "--variants", "fp8,nosuch", "--db", str(synthetic_db)]) == 2
    assert "nosuch" in capsys.readouterr().err
