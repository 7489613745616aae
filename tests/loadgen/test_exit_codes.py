"""What CI reads from ``servelab run``: exit codes for the error rate and the flags, a dead
master's run resolved to ``interrupted``, a spool that outlives its close, and a closed loop that
backs off from a server that fails at once."""
import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from loadgen_helpers import chat_profile, dicts, query, servelab
from servelab.commands.run import (EXIT_ERROR_RATE, EXIT_FLAGGED, EXIT_NOT_COMPLETED, EXIT_OK,
                                   exit_code)
from servelab.loadgen.backoff import BACKOFF_MAX_S, backoff_s, backs_off
from servelab.orchestration.runner import RunResult
from servelab.store.db import open_db
from servelab.store.ingest import resolve_abandoned
from servelab.store.rows import RequestRow
from servelab.store.spool import Spool, read_spool


def _result(status="completed", rate=0.0, flags=(), interrupted=False):
    return RunResult("r", 0 if status == "completed" else 1, status, Path("db"), Path("logs"),
                     interrupted, rate, list(flags))


def test_exit_codes_table():
    assert exit_code(_result(), 0.5, ["rows_lost"]) == EXIT_OK
    assert exit_code(_result(rate=None), 0.5, ["rows_lost"]) == EXIT_OK   # nothing sent
    assert exit_code(_result(rate=0.5), 0.5, []) == EXIT_OK              # "passes": above
    assert exit_code(_result(rate=0.51), 0.5, []) == EXIT_ERROR_RATE
    assert exit_code(_result(rate=1.0), 1.0, []) == EXIT_OK              # 1: errors never fail
    assert exit_code(_result(flags=["rows_lost"]), 0.5, ["rows_lost"]) == EXIT_FLAGGED
    # a busy machine's saturation flag is a measurement, not a failed run
    assert exit_code(_result(flags=["generator_saturated"]), 0.5, ["rows_lost"]) == EXIT_OK
    assert exit_code(_result(flags=["generator_saturated"]), 0.5,
                     ["generator_saturated"]) == EXIT_FLAGGED
    assert exit_code(_result("interrupted"), 0.5, []) == EXIT_NOT_COMPLETED
    assert exit_code(_result(interrupted=True), 0.5, []) == EXIT_NOT_COMPLETED
    assert exit_code(_result("failed", rate=1.0), 0.5, []) == EXIT_NOT_COMPLETED


def test_max_error_rate_must_be_a_share():
    res = servelab("run", "--profile", "x.yaml", "--max-error-rate", "5")
    assert res.returncode == 2
    assert "--max-error-rate" in res.stderr and "between 0 and 1" in res.stderr


def test_backoff_waits_only_after_repeated_fast_failures():
    assert [backoff_s(n) for n in range(5)] == [0.0, 0.0, 0.05, 0.1, 0.2]
    assert backoff_s(50) == BACKOFF_MAX_S
    assert backs_off("connect_refused") and backs_off("http_503") and backs_off("http_500")
    assert not backs_off(None) and not backs_off("http_429") and not backs_off("stream_cut")


def _spool_row(run_id: str, seq: int) -> bytes:
    return orjson.dumps(RequestRow(run_id=run_id, request_id=f"{run_id}-w0-{seq}", worker="w0",
                                   worker_seq=seq, class_name="chat", stage=0,
                                   sent_unix=time.time(), e2e_ms=12.0)) + b"\n"


def test_spool_write_after_close_still_lands(tmp_path):
    spool = Spool(tmp_path, "r1", "w0")
    spool.started(0)
    spool.request(_spool_row("r1", 0))
    spool.close()
    # a request that finished after a stop signal closed the spool: no EBADF, and the row is kept
    spool.started(1)
    spool.request(_spool_row("r1", 1))
    spool.close()
    got = read_spool(tmp_path / "r1" / "w0")
    assert got.seqs == {0, 1} and got.in_flight_lost == 0


def test_run_whose_master_died_is_resolved_to_interrupted(tmp_path):
    db = tmp_path / "t.duckdb"
    spool_root = tmp_path / "spool"
    con = open_db(db)
    settings = json.dumps({"spool_dir": str(spool_root)})
    for run_id, status in (("dead", "running"), ("done", "completed")):
        con.execute("INSERT INTO runs (run_id, started_unix, status, settings, flags) "
                    "VALUES (?, ?, ?, ?, [])", [run_id, time.time(), status, settings])
    con.close()
    # what the SIGKILLed master's worker left: 3 rows spooled, one more request in flight
    spool = Spool(spool_root, "dead", "w0")
    for seq in range(4):
        spool.started(seq)
    for seq in range(3):
        spool.request(_spool_row("dead", seq))
    spool.close()

    res = servelab("runs", "--db", str(db))
    assert res.returncode == 0, res.stdout + res.stderr
    runs = {r["run_id"]: r for r in dicts(db, "SELECT * FROM runs")}
    assert runs["done"]["status"] == "completed"
    dead = runs["dead"]
    assert dead["status"] == "interrupted"
    assert "the master stopped without ending the run" in dead["notes"]
    assert "3 rows stored" in dead["notes"] and "1 requests in flight lost" in dead["notes"]
    assert "rows_lost" in dead["flags"]
    assert query(db, "SELECT count(*) FROM requests WHERE run_id = 'dead'")[0][0] == 3
    (w0,) = dicts(db, "SELECT * FROM run_workers WHERE run_id = 'dead'")
    assert w0["status"] == "recovered" and w0["in_flight_lost"] == 1
    assert resolve_abandoned(db) == []   # once only


def test_a_file_held_by_a_live_master_is_left_alone(tmp_path):
    db = tmp_path / "t.duckdb"
    con = open_db(db)
    con.execute("INSERT INTO runs (run_id, started_unix, status, flags) VALUES "
                "('live', 1.0, 'running', [])")
    con.close()
    # another process holds the file, as a master does for the whole run
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; "
                               f"c = duckdb.connect({str(db)!r}); print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert resolve_abandoned(db) == []
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert query(db, "SELECT status FROM runs")[0][0] == "running"


FAILING = chat_profile("failing_server",
                       "One closed-loop user against a server that answers every request with HTTP 500.",
                       (20, 40), (10, 20), 1, "6s", seed=3)


@pytest.mark.slow
def test_closed_loop_backs_off_from_a_failing_server_and_the_run_fails(tmp_path):
    profile = tmp_path / "failing.yaml"
    profile.write_text(FAILING)
    db = tmp_path / "t.duckdb"
    res = servelab("run", "--profile", str(profile), "--db", str(db), "--faults", "http500=1",
                   "--quiet", timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == EXIT_ERROR_RATE, out[-3000:]
    assert "above --max-error-rate" in out
    (run,) = dicts(db, "SELECT * FROM runs")
    assert run["status"] == "completed"
    rows = dicts(db, "SELECT sent_unix, error_kind FROM requests ORDER BY sent_unix")
    assert rows and all(r["error_kind"] == "http_500" for r in rows)
    # the gaps grow along the back-off schedule: the sum of the waits bounds the count from
    # above whatever the machine's speed (no wall-clock limit asserted)
    span = rows[-1]["sent_unix"] - rows[0]["sent_unix"]
    waits, n = 0.0, 1
    while waits <= span:
        n += 1
        waits += backoff_s(n)
    assert len(rows) <= n + 1, (len(rows), span)
    gaps = [b["sent_unix"] - a["sent_unix"] for a, b in zip(rows, rows[1:])]
    assert max(gaps) >= BACKOFF_MAX_S * 0.9, gaps   # it reached the cap
    print(f"{len(rows)} requests in {span:.1f} s against a server failing every one")
