"""The generator notices when it is itself the bottleneck: loop lag measured by the health probe,
and the run flagged from those samples (a stage's typical second over 5 ms of lag or 90% CPU)."""
import pytest

from loadgen_helpers import HERE, json_lines, query, run_script
from servelab.store import runs
from servelab.store.db import Store, open_db
from servelab.store.rows import HealthRow, RequestRow, RunRow, StageRow

pytestmark = pytest.mark.slow


# Its idle phase must see an idle loop: a neighbour test's load is lag it would count.
@pytest.mark.serial
def test_loop_lag_is_seen_and_flags_the_stage(tmp_path):
    rows = {r["phase"]: r for r in json_lines(run_script(HERE / "health_probe.py"))}
    idle, busy = rows["idle"], rows["busy"]
    assert idle["loop_lag_p99_ms"] < runs.LOOP_LAG_LIMIT_MS, idle
    assert busy["loop_lag_p99_ms"] > runs.LOOP_LAG_LIMIT_MS, busy
    assert busy["cpu_percent"] > idle["cpu_percent"] + 30, (idle, busy)

    db = tmp_path / "t.duckdb"
    store = Store(open_db(db))
    store.append_rows("runs", [RunRow("r", status="completed", flags=["predicted"])])
    store.append_rows("requests", [RequestRow(run_id="r", request_id="q", worker="w0", worker_seq=1)])
    store.append_rows("stages", [
        StageRow("r", 0, "concurrency", 8.0, started_unix=100.0, ended_unix=110.0),
        StageRow("r", 1, "concurrency", 16.0, started_unix=110.0, ended_unix=120.0)])
    # stage 0: every second idle; stage 1: most seconds busy, so its typical second is
    sampled = {phase: {k: v for k, v in row.items() if k != "phase"}
               for phase, row in rows.items()}
    health = [HealthRow(**dict(sampled["idle"], run_id="r", t_unix=100.5 + i)) for i in range(10)]
    health += [HealthRow(**dict(sampled["busy" if i % 4 else "idle"], run_id="r",
                                t_unix=110.5 + i)) for i in range(10)]
    store.append_rows("client_health", health)
    flags = runs.refresh_flags(store.con, "r")
    assert flags == ["predicted", "generator_saturated"]
    (sat,) = runs.saturation(store.con, "r")
    assert (sat.worker, sat.stage) == ("w0", 1) and sat.loop_lag_p99_ms > 5
    store.close()
    assert query(db, "SELECT flags FROM runs")[0][0] == ["predicted", "generator_saturated"]
