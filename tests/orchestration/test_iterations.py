"""vLLM's iteration lines read from a real server log into server_iterations (real DuckDB file)."""
from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import duckdb
import pytest

from servelab.core.errors import ServelabError
from servelab.orchestration.iterations import (ingest_iteration_log, parse_lines,
                                               spread_in_seconds)
from servelab.specs.iteration_log import format_iteration, parse_iteration
from servelab.store.db import open_db

LOG = Path(__file__).parent / "data" / "vllm_iterations" / "vllm026_h200.log"
# the capture's clock was UTC; the slices cover 20:54:23-20:55:50 on 2026-12-01
T0 = calendar.timegm(time.strptime("2026-12-01 20:54:20", "%Y-%m-%d %H:%M:%S"))


def _run(db: Path, start: float, end: float, run_id: str = "r1") -> None:
    con = open_db(db)
    con.execute("INSERT INTO runs (run_id, started_unix, finished_unix, status) "
                "VALUES (?, ?, ?, 'completed')", [run_id, start, end])
    con.close()


def _independent_counts(text: str) -> dict:
    """What the log says, counted with a plain pattern, not the parser under test."""
    pat = re.compile(r"Iteration\(\d+\): (\d+) context requests, (\d+) context tokens, "
                     r"(\d+) generation requests, (\d+) generation tokens")
    found = [tuple(map(int, m.groups())) for m in pat.finditer(text)]
    return {"lines": len(found), "ctx_req": sum(f[0] for f in found),
            "ctx_tok": sum(f[1] for f in found), "gen_tok": sum(f[3] for f in found)}


def test_every_line_of_the_real_log_is_read():
    text = LOG.read_text()
    want = _independent_counts(text)
    got = [it for _, it in parse_lines(text)]
    assert len(got) == want["lines"] == 337
    assert sum(i.context_requests for i in got) == want["ctx_req"]
    assert sum(i.context_requests > 0 for i in got) == 19
    assert sum(i.context_tokens for i in got) == want["ctx_tok"]
    assert sum(i.generation_tokens for i in got) == want["gen_tok"]
    assert {i.engine for i in got} == {0} and not any(i.dummy for i in got)
    assert got[0].index == 0 and got[0].stamp == "12-01 20:54:23"
    assert got[0].elapsed_ms == 0.04 and got[0].kv_cache_usage_pct == 0.0


def test_the_simulator_writes_what_the_reader_reads():
    msg = format_iteration(3, 41, 2, 8192, 30, 30, 27.456, 0.4567)
    got = parse_iteration("INFO 12-01 20:54:23 [loggers.py:182] " + msg)
    assert (got.engine, got.index, got.context_requests, got.context_tokens,
            got.generation_requests, got.generation_tokens) == (3, 41, 2, 8192, 30, 30)
    assert got.elapsed_ms == 27.46 and got.kv_cache_usage_pct == 45.7
    # the dummy step of a data-parallel rank, and a compose-prefixed line
    dummy = parse_iteration("web-1  | (EngineCore_DP1 pid=9) INFO 01-02 03:04:05 [loggers.py:182] "
                            "Engine 001: Iteration(7): 0 context requests, 0 context tokens, 0 "
                            "generation requests, 0 generation tokens, iteration elapsed time: "
                            "0.00 ms (dummy), GPU KV cache usage: 1.5%")
    assert dummy.dummy and dummy.engine == 1 and dummy.stamp == "01-02 03:04:05"
    assert parse_iteration("INFO 12-01 20:54:23 [loggers.py:182] Engine 000: Avg prompt "
                           "throughput: 1.0 tokens/s") is None


def test_ingest_places_each_line_in_its_second_and_in_order(tmp_path):
    db = tmp_path / "r.duckdb"
    _run(db, T0, T0 + 100)
    report = ingest_iteration_log(db, "r1", LOG)
    assert (report.lines, report.stored, report.outside, report.utc_offset_s) == (337, 337, 0, 0)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT iteration, log_second_unix, time_unix, time_error_s FROM "
                       "server_iterations ORDER BY line_no").fetchall()
    note = con.execute("SELECT notes FROM runs").fetchone()[0]
    con.close()
    assert len(rows) == 337 and note.startswith("server_iterations: 337 iteration lines")
    for _, second, t, err in rows:
        assert second <= t < second + 1 and err == 0.5
    times = [r[2] for r in rows]
    assert times == sorted(times)
    # no second of this slice has busy neighbours on both sides, so there is no typical spacing
    # to go by: the 48-step warm-up burst is spread evenly over its second
    first = [r for r in rows if r[1] == T0 + 3]
    assert len(first) == 48 and first[0][2] == pytest.approx(T0 + 3 + 0.5 / 48)


def test_a_second_ingest_replaces_and_lines_outside_the_run_are_counted(tmp_path):
    db = tmp_path / "r.duckdb"
    _run(db, T0 + 60, T0 + 100)   # only the second slice (20:55:49-50) is inside
    ingest_iteration_log(db, "r1", LOG)
    report = ingest_iteration_log(db, "r1", LOG)
    con = duckdb.connect(str(db), read_only=True)
    n = con.execute("SELECT count(*) FROM server_iterations").fetchone()[0]
    notes = con.execute("SELECT notes FROM runs").fetchone()[0]
    con.close()
    assert n == report.stored == 106 and report.outside == 231
    assert notes.count("server_iterations:") == 1 and "231 lines outside the run" in notes


def test_the_log_clock_zone_is_found_from_the_run(tmp_path):
    db = tmp_path / "r.duckdb"
    _run(db, T0 - 5400, T0 - 5400 + 100)   # a log written at UTC+1:30
    report = ingest_iteration_log(db, "r1", LOG)
    assert report.utc_offset_s == 5400 and report.stored == 337
    assert "UTC+1.5h" in report.note()


def test_spreading_within_a_second():
    # busy on both sides: even; a burst that starts: packed at the end at the busy spacing
    seconds = [10.0] * 4 + [11.0] * 4 + [12.0] * 4 + [13.0] * 2
    t = spread_in_seconds(seconds)
    assert t[4:8] == [11.125, 11.375, 11.625, 11.875]
    assert t[:4] == [10.125, 10.375, 10.625, 10.875]    # 1/n == the spacing here
    assert t[12:] == [13.125, 13.375]                   # a burst that ends: from the start
    lone = spread_in_seconds(seconds + [20.0, 20.0])   # alone in its second: centred
    assert lone[-2:] == [20.375, 20.625]


def test_bad_input_names_the_file_and_the_run(tmp_path):
    db = tmp_path / "r.duckdb"
    _run(db, T0, T0 + 100)
    with pytest.raises(ServelabError, match="no such log file"):
        ingest_iteration_log(db, "r1", tmp_path / "missing.log")
    with pytest.raises(ServelabError, match="--run nope: no such run"):
        ingest_iteration_log(db, "nope", LOG)


def test_servelab_ingest_log_adds_a_saved_log_to_a_run(tmp_path, cli):
    import gzip

    db = tmp_path / "r.duckdb"
    _run(db, T0, T0 + 100)
    gz = tmp_path / "vllm.log.gz"
    gz.write_bytes(gzip.compress(LOG.read_bytes()))
    code, out, err = cli("ingest-log", "--run", "r1", gz, "--db", db)
    assert code == 0 and out.startswith("server_iterations: 337 iteration lines from vllm.log.gz")
    code, out, err = cli("ingest-log", "--run", "r1", gz, "--db", db, "--utc-offset", "2")
    assert code == 0 and "0 iteration lines" in out and "337 lines outside the run" in out
    code, out, err = cli("ingest-log", "--run", "nope", gz, "--db", db)
    assert code == 2 and "--run nope: no such run" in err
