"""Failures are results: a worker killed mid-run, a faulty server, a server without /metrics,
and the clear refusals when a run cannot start at all."""
import json
import os
import signal
import socket

import duckdb
import pytest

from loadgen_helpers import (PROFILES, ROOT, calibration, dicts, query, run_against, run_status,
                             servelab, sim, start_servelab, wait_for)
from servelab.core.procs import free_port
from servelab.store.spool import read_spool




@pytest.mark.slow
def test_worker_killed_mid_run_is_accounted_exactly(tmp_path):
    db = tmp_path / "res" / "t.duckdb"
    spool_root = tmp_path / "spool"
    with sim(tmp_path) as url:
        proc = start_servelab("run", "--profile", str(PROFILES / "long_closed.yaml"),
                              "--target", url, "--workers", "2", "--db", str(db),
                              "--spool-dir", str(spool_root), "--quiet",
                              log=tmp_path / "run.log")

        def status():
            data = run_status(db)
            return data if data and all(w["produced"] >= 4 for w in
                                        data["workers"].values()) else None

        st = wait_for(status, 60, "both workers producing rows")
        meta = json.loads((spool_root / st["run_id"] / "w1" / "meta.json").read_text())
        os.kill(meta["pid"], signal.SIGKILL)
        assert proc.wait(timeout=120) == 4   # the run completed; the loss is flagged (exit 4)
    out = (tmp_path / "run.log").read_text()
    run_id = st["run_id"]
    spool = read_spool(spool_root / run_id / "w1")
    (w1,) = dicts(db, "SELECT * FROM run_workers WHERE worker = 'w1'")
    stored_w1 = query(db, "SELECT count(*) FROM requests WHERE worker = 'w1'")[0][0]
    # exact figures from the spool the dead worker left behind
    assert w1["status"] == "lost"
    assert w1["produced"] == len(spool.seqs) and w1["stored"] == stored_w1
    assert w1["in_flight_lost"] == spool.in_flight_lost == len(spool.started - spool.seqs)
    assert w1["in_flight_lost"] >= 1      # it had users with requests in flight
    (w0,) = dicts(db, "SELECT * FROM run_workers WHERE worker = 'w0'")
    assert w0["status"] == "finished" and w0["produced"] == w0["stored"] > 0
    (run,) = dicts(db, "SELECT * FROM runs")
    assert "rows_lost" in run["flags"] and run["status"] == "completed"
    assert f"worker w1 was lost: {w1['produced']} rows produced, {stored_w1} stored" in run["notes"]
    assert "servelab ingest" in out and "rows_lost" in out

    res = servelab("ingest", str(spool_root / run_id / "w1"), "--db", str(db))
    assert res.returncode == 0, res.stderr
    # the console wraps a long spool path's line: compare the words, not the line breaks
    assert f"{w1['produced'] - stored_w1} added" in " ".join(res.stdout.split())
    (w1,) = dicts(db, "SELECT * FROM run_workers WHERE worker = 'w1'")
    assert w1["stored"] == w1["produced"] == len(spool.seqs)
    assert w1["status"] == "recovered"
    seqs = {s for (s,) in query(db, "SELECT worker_seq FROM requests WHERE worker = 'w1'")}
    assert seqs == spool.seqs


@pytest.mark.slow
def test_faulty_server_gives_classified_errors(tmp_path):
    db = tmp_path / "t.duckdb"
    # no --target: servelab starts the simulator itself (with faults) and stops it afterwards
    res = servelab("run", "--profile", str(PROFILES / "faults.yaml"), "--db", str(db),
                   "--hardware", "H100", "--seed", "4", "--timeout-between-chunks", "0.5",
                   "--faults", "http500=0.12,stall=0.12:1.5s,cut=0.12,malformed=0.12,"
                   "error_event=0.12", "--max-error-rate", "1", "--quiet")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = dicts(db, "SELECT * FROM runs")
    assert run["status"] == "completed" and run["hardware"] == "H100"
    kinds = dict(query(db, "SELECT coalesce(error_kind, 'ok'), count(*) FROM requests "
                           "GROUP BY ALL"))
    assert {"ok", "http_500", "timeout_between_chunks", "stream_cut", "malformed_json",
            "error_event"} <= set(kinds), kinds
    (body,) = query(db, "SELECT any_value(error_text) FROM requests WHERE error_kind = "
                        "'http_500'")[0]
    assert "Internal server error" in body
    cut = dicts(db, "SELECT * FROM requests WHERE error_kind = 'stream_cut'")
    assert all(r["http_status"] == 200 and r["output_tokens"] < r["output_tokens_target"]
               for r in cut)
    # the simulator was stopped: nothing listens on its port any more
    port = int(run["target"].rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_target_without_metrics_and_sessions_in_one_process(tmp_path):
    db = tmp_path / "t.duckdb"
    with calibration(tmp_path, "--ttft-ms", "15", "--itl-ms", "3", "--no-metrics") as url:
        run_against(url, PROFILES / "sessions.yaml", db, "--workers", "0")
    (run,) = dicts(db, "SELECT * FROM runs")
    assert run["workers"] == 0 and run["status"] == "completed"
    assert json.loads(run["settings"])["metrics_scrape"] == "absent"
    assert query(db, "SELECT count(*) FROM server_metrics")[0][0] == 0
    rows = dicts(db, "SELECT * FROM requests ORDER BY sent_unix")
    assert rows and all(r["error_kind"] is None for r in rows)
    sessions = {}
    for r in rows:
        sessions.setdefault(r["session_id"], []).append(r)
    full = [s for s in sessions.values() if s[0]["turn"] == 1 and len(s) >= 2]
    assert full
    for turns in full:
        # one user, in order, each turn after the previous answer and its think time, resending
        # the growing history
        assert [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
        assert len({t["worker"] for t in turns}) == 1
        for a, b in zip(turns, turns[1:]):
            assert b["sent_unix"] >= a["done_unix"] + 0.1 - 0.002
            assert b["prompt_tokens"] > a["prompt_tokens"] + a["output_tokens"]


def test_runs_that_cannot_start_say_why(tmp_path):
    port = free_port()
    res = servelab("run", "--profile", str(ROOT / "traffic_profiles" / "smoke.yaml"), "--target",
                   f"http://127.0.0.1:{port}", "--db", str(tmp_path / "a.duckdb"))
    assert res.returncode == 2 and "not reachable" in res.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: x\nclasses: []\n")
    res = servelab("run", "--profile", str(bad), "--db", str(tmp_path / "a.duckdb"))
    assert res.returncode == 2 and str(bad) in res.stderr and "load" in res.stderr

    locked = tmp_path / "locked.duckdb"
    holder = duckdb.connect(str(locked))
    try:
        res = servelab("run", "--profile", str(ROOT / "traffic_profiles" / "smoke.yaml"),
                       "--db", str(locked))
    finally:
        holder.close()
    assert res.returncode == 2 and "in use by another process" in res.stderr
    assert f"PID {os.getpid()}" in res.stderr
