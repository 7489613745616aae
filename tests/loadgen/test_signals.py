"""SIGTERM, SIGINT and SIGKILL to each process of a run (``servelab run``, the Locust master, a
worker) in the middle of it: no finished request without a row, no process left behind, the run
never left ``running``, and ``servelab run`` exits non-zero.

Each case is one real run against the simulator (about 10-20 s), so they are slow. The done
criterion of issue 11 is ten of each: ``SERVELAB_SIGNAL_REPEATS=10 pytest -m slow
tests/loadgen/test_signals.py``.
"""
import json
import os
import signal
import time

import psutil
import pytest

from loadgen_helpers import (chat_profile, dicts, query, run_status, servelab, sim,
                             sim_requests, start_servelab, wait_for)

REPEATS = int(os.environ.get("SERVELAB_SIGNAL_REPEATS", "1"))
PROFILE = chat_profile("long_for_signals",
                       "A closed-loop run long enough to stop one of its processes in the middle.",
                       (20, 60), (30, 80), 6, "60s")




def _status(db):
    data = run_status(db)
    return data if data and data.get("produced", 0) >= 10 else None


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


# The run and the master take SIGINT and SIGTERM through one handler (runner.py's and
# plugin._stop_signals_like_ctrl_c): one of the two is enough in the default suite; a worker's
# SIGTERM is Locust's own path and its SIGINT servelab's, so both stay. SERVELAB_SIGNAL_REPEATS
# (the ten of each) runs every pair.
PAIRS = [(role, sig) for role in ("run", "master", "worker")
         for sig in ("SIGTERM", "SIGINT", "SIGKILL")
         if REPEATS > 1 or not (sig == "SIGINT" and role != "worker")]


@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("role, sig", PAIRS)
def test_stop_signal_mid_run(tmp_path, role, sig, repeat):
    _stop_mid_run(tmp_path, role, sig, workers=1)


@pytest.mark.slow
@pytest.mark.parametrize("role,sig", [("run", "SIGTERM"), ("run", "SIGINT"), ("run", "SIGKILL"),
                                      ("master", "SIGKILL")])
def test_stop_signal_mid_run_in_one_process(tmp_path, role, sig):
    """--workers 0: the master's process runs the users too."""
    _stop_mid_run(tmp_path, role, sig, workers=0)


def _stop_mid_run(tmp_path, role, sig, workers):
    profile = tmp_path / "long.yaml"
    profile.write_text(PROFILE)
    db = tmp_path / "res" / "t.duckdb"
    spool_root = tmp_path / "spool"
    with sim(tmp_path) as url:
        proc = start_servelab("run", "--profile", str(profile), "--target", url,
                              "--workers", str(workers), "--db", str(db), "--spool-dir", str(spool_root),
                              "--drain-timeout", "10", "--quiet", log=tmp_path / "run.log")
        try:
            st = wait_for(lambda: _status(db) or (not proc.alive() and
                                                    AssertionError((tmp_path / "run.log")
                                                                   .read_text()[-3000:])),
                           90, "rows flowing")
            assert not isinstance(st, AssertionError), st
            tree = psutil.Process(proc.pid).children(recursive=True)
            assert len(tree) >= 1 + workers, tree   # the master and the workers
            if role == "run":
                pid = proc.pid
            elif role == "master":
                pid = st["pid"]
            else:
                meta = json.loads((spool_root / st["run_id"] / "w0" / "meta.json").read_text())
                pid = meta["pid"]
            t0 = time.monotonic()
            os.kill(pid, getattr(signal, sig))
            code = proc.wait(timeout=150)
            # a SIGKILLed `servelab run` cleans up nothing: its children are told by the kernel
            # (parent-death signal) and end the run themselves
            wait_for(lambda: not _alive(tree), 60, "every child of servelab run to exit")
            took = time.monotonic() - t0
        finally:
            proc.stop(5)
        served = sim_requests(url)
    log = (tmp_path / "run.log").read_text()
    run_id = st["run_id"]
    if role == "run" and sig == "SIGKILL":
        # no `servelab run` left to end the record: the next `servelab runs` resolves it
        res = servelab("runs", "--db", str(db))
        assert res.returncode == 0, res.stdout + res.stderr
    else:
        assert code != 0, log[-3000:]
    (run,) = dicts(db, "SELECT * FROM runs")
    assert run["status"] == "interrupted", (run, log[-3000:])
    killed_users = sig == "SIGKILL" and (role == "worker" or (role == "master" and not workers))
    if not (sig == "SIGKILL" and role == "master"):
        # the master itself ended the run (a drain), not a later resolution of a dead master's
        assert "the master stopped without ending" not in (run["notes"] or ""), run["notes"]
    if sig == "SIGKILL" and role == "worker":
        # what the run's note says to do: the dead worker's spool holds its unshipped rows
        assert "servelab ingest" in (run["notes"] or ""), run["notes"]
        res = servelab("ingest", str(spool_root / run_id), "--db", str(db))
        assert res.returncode == 0, res.stdout + res.stderr
    rows = {r for (r,) in query(db, "SELECT request_id FROM requests")}
    finished = {r["x_request_id"] for r in served if r.get("x_request_id", "").startswith(run_id)
                and r.get("finish_reason") not in (None, "abort")}
    missing = finished - rows
    lost = query(db, "SELECT coalesce(sum(in_flight_lost), 0) FROM run_workers")[0][0]
    if killed_users:
        # killed between the server's last byte and the row: counted as in flight, never silent
        assert len(missing) <= lost, (len(missing), lost)
    else:
        assert not missing, (len(missing), sorted(missing)[:5], log[-3000:])
    for text in [log] + [p.read_text(errors="replace")
                         for p in (db.parent / "logs" / run_id).glob("*.log")]:
        assert "Bad file descriptor" not in text and "Traceback" not in text, text[-3000:]
    print(f"{role} {sig}: exit {code} after {took:.1f} s, {len(rows)} rows, "
          f"{len(finished)} finished at the server, {lost} in flight lost")
