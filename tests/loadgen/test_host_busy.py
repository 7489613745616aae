"""The saturation flag tells its two causes apart: a worker that did the work itself
(generator_saturated: add workers) and one whose host gave its cores to other processes
(host_busy: a quieter host). Both made for real: CPU hogs beside a one-user run that the host
gives a core only part of the time, and a worker whose own loop is kept busy."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loadgen_helpers import (ROOT, chat_profile, dicts, json_lines, query, run_script, run_status,
                             sim, wait_for)
from servelab.core import procs
from servelab.store import runs
from servelab.store.db import Store, open_db
from servelab.store.rows import HealthRow, RequestRow, RunRow, StageRow

# Both tests judge how busy this host is: another test beside them would be counted as a hog.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

ONE_USER = chat_profile("one_user",
                       "One closed-loop user, the lightest run there is.",
                       (20, 40), (20, 40), 1, "9s")
HOG_S = 8.0
# A spinning loop per hog: two per core keep every core's run queue longer than one.
HOG = ("import sys, time\nend = time.time() + float(sys.argv[1])\n"
       "while time.time() < end: pass")


# A greenlet holds the worker's loop 30 ms at a time (test_health.py's probe holds it 8 ms of
# every 10, whose lag can fall in step with the probe's own 10 ms): the health monitor's row.
BUSY_PROBE = """\
from gevent import monkey
monkey.patch_all()
import dataclasses, json, time
import gevent
from servelab.loadgen.worker.health import HealthMonitor

class Rows:
    def record_health(self, row):
        pass

def hog():
    while True:
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:
            pass
        gevent.sleep(0.001)

monitor = HealthMonitor("run", "w0", Rows(), lambda: 0, lambda: 0)
gevent.sleep(0.3)
g = gevent.spawn(hog)
monitor.reset()
gevent.sleep(1.5)
print(json.dumps(dataclasses.asdict(monitor.sample())), flush=True)
g.kill()
monitor.stop()
"""




class Descheduler:
    """Takes the CPU away from a process tree for OFF_S of every PERIOD_S, as a host whose cores
    other processes hold does. The kernel's own choice (nice 19 beside hogs) was tried first and
    is not repeatable: with autogroups and EEVDF's wake-up rules a light sleeper may wait 1 ms
    or 6 ms for a core, so its lag fell either side of the limit from one machine to the next."""
    OFF_S, PERIOD_S = 0.025, 0.04

    def __init__(self, pid: int):
        import psutil

        root = psutil.Process(pid)
        self.procs = [root, *root.children(recursive=True)]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _signal(self, sig) -> None:
        for proc in self.procs:
            try:
                proc.send_signal(sig)
            except Exception:   # gone: the run ended
                pass

    def _loop(self) -> None:
        while not self.stopped.is_set():
            self._signal(signal.SIGSTOP)
            time.sleep(self.OFF_S)
            self._signal(signal.SIGCONT)
            self.stopped.wait(self.PERIOD_S - self.OFF_S)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()
        self._signal(signal.SIGCONT)


def test_cpu_hogs_beside_a_one_user_run_flag_host_busy(tmp_path):
    profile = tmp_path / "one_user.yaml"
    profile.write_text(ONE_USER)
    db = tmp_path / "res" / "t.duckdb"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_HOME=str(ROOT))
    hogs: list[subprocess.Popen] = []
    with sim(tmp_path) as url:
        # The hogs fill every core; the run gets a core for 15 ms of every 40 once it sends
        # (before that, python's imports would only be slower).
        run = procs.spawn("servelab", [sys.executable, "-m", "servelab.cli",
                                       "run", "--profile", str(profile), "--target", url,
                                       "--workers", "0", "--db", str(db), "--quiet"],
                          tmp_path / "run.log", env=env, cwd=ROOT)
        try:
            def producing():
                data = run_status(db)
                return data if data and data.get("produced", 0) >= 1 else None

            wait_for(producing, 90, "the run's first row")
            hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(HOG_S)])
                    for _ in range(2 * (os.cpu_count() or 1))]
            with Descheduler(run.proc.pid):
                time.sleep(HOG_S)
            assert run.wait(180) == 0, (tmp_path / "run.log").read_text()[-3000:]
        finally:
            for h in hogs:
                h.kill()
                h.wait()
            run.stop(10)
    out = (tmp_path / "run.log").read_text()
    (flags,) = query(db, "SELECT flags FROM runs")[0]
    assert "host_busy" in flags and "generator_saturated" not in flags, (flags, out[-3000:])
    assert "host busy" in out and "run on a quieter host" in out, out[-3000:]
    health = dicts(db, "SELECT * FROM client_health h JOIN stages s USING (run_id) "
                       "WHERE h.t_unix >= s.started_unix AND h.t_unix < s.ended_unix")
    hogged = [h for h in health if h["host_cpu_percent"] >= runs.HOST_BUSY_CPU]
    assert len(hogged) * 2 > len(health), health
    assert all(h["cpu_percent"] < runs.OWN_CPU_BUSY for h in hogged), hogged
    assert all(h["host_runnable_per_core"] is not None and h["host_load_per_core"] is not None
               and h["involuntary_switches_per_s"] is not None for h in health)


def test_a_worker_busy_with_its_own_loop_is_generator_saturated(tmp_path):
    script = tmp_path / "busy_probe.py"
    script.write_text(BUSY_PROBE)
    (busy,) = json_lines(run_script(script))
    assert busy["loop_lag_p99_ms"] > runs.LOOP_LAG_LIMIT_MS, busy
    assert busy["cpu_percent"] >= runs.OWN_CPU_BUSY and busy["host_cpu_percent"] is not None, busy
    db = tmp_path / "t.duckdb"
    store = Store(open_db(db))
    store.append_rows("runs", [RunRow("r", status="completed")])
    store.append_rows("requests", [RequestRow(run_id="r", request_id="q", worker="w0", worker_seq=1)])
    store.append_rows("stages", [StageRow("r", 0, "concurrency", 1.0, started_unix=100.0,
                                          ended_unix=110.0)])
    sample = {k: v for k, v in busy.items() if k != "phase"}
    # even on a busy host: the worker used the CPU itself, so more workers is the remedy
    sample.update(host_cpu_percent=100.0, host_runnable_per_core=3.0)
    store.append_rows("client_health", [HealthRow(**dict(sample, run_id="r", t_unix=100.5 + i))
                                        for i in range(10)])
    assert runs.refresh_flags(store.con, "r") == ["generator_saturated"], busy
    (sat,) = runs.saturation(store.con, "r")
    assert sat.cause == "generator"
    # the same lag at 2% of a core on that host: the host's other processes held the cores
    store.con.execute("UPDATE client_health SET cpu_percent = 2.0")
    assert runs.refresh_flags(store.con, "r") == ["host_busy"]
    # and with no sign of a busy host (old rows without the host columns): the generator
    store.con.execute("UPDATE client_health SET host_cpu_percent = NULL, "
                      "host_runnable_per_core = NULL, host_steal_percent = NULL, "
                      "involuntary_switches_per_s = NULL")
    assert runs.refresh_flags(store.con, "r") == ["generator_saturated"]
    store.close()
