"""The generator notices when it is itself the bottleneck: loop lag measured by the health probe,
and the run flagged from those samples (a stage's typical second over 5 ms of lag or 90% CPU)."""
import json
import subprocess
import sys

from loadgen_helpers import HERE, _env, query
from servelab.store import runs
from servelab.store.db import Store, open_db


def test_loop_lag_is_seen_and_flags_the_stage(tmp_path):
    res = subprocess.run([sys.executable, str(HERE / "health_probe.py")], capture_output=True,
                         text=True, timeout=60, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["phase"]: r for r in map(json.loads, res.stdout.splitlines())}
    idle, busy = rows["idle"], rows["busy"]
    assert idle["loop_lag_p99_ms"] < runs.LOOP_LAG_LIMIT_MS, idle
    assert busy["loop_lag_p99_ms"] > runs.LOOP_LAG_LIMIT_MS, busy
    assert busy["cpu_percent"] > idle["cpu_percent"] + 30, (idle, busy)

    db = tmp_path / "t.duckdb"
    store = Store(open_db(db))
    store.append_rows("runs", [{"run_id": "r", "status": "completed", "flags": ["predicted"]}])
    store.append_rows("stages", [
        {"run_id": "r", "stage": 0, "kind": "concurrency", "level": 8.0, "started_unix": 100.0,
         "ended_unix": 110.0},
        {"run_id": "r", "stage": 1, "kind": "concurrency", "level": 16.0, "started_unix": 110.0,
         "ended_unix": 120.0}])
    # stage 0: every second idle; stage 1: most seconds busy, so its typical second is
    health = [dict(idle, run_id="r", t_unix=100.5 + i) for i in range(10)]
    health += [dict(busy if i % 4 else idle, run_id="r", t_unix=110.5 + i) for i in range(10)]
    for h in health:
        h.pop("phase")
    store.append_rows("client_health", health)
    flags = runs.refresh_flags(store.con, "r")
    assert flags == ["predicted", "generator_saturated"]
    (sat,) = runs.saturation(store.con, "r")
    assert (sat.worker, sat.stage) == ("w0", 1) and sat.loop_lag_p99_ms > 5
    store.close()
    assert query(db, "SELECT flags FROM runs")[0][0] == ["predicted", "generator_saturated"]
