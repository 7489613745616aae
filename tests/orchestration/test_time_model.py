"""One time model (issue 13, item 2): ``servelab predict`` times a profile's stages as
``servelab run`` does (sim.engine.virtual_stages), so both give the same stage figures.

The agreement itself, run against ``servelab sim`` in real time, is bench/fidelity.py's (an
end-to-end run does not fit the suite's budget); these tests pin the plan's rules and that
predict follows them."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from servelab.profiles import load_profile
from servelab.profiles.planner import RequestPlanner
from servelab.sim.engine.virtual_stages import (
    OPEN_LEAD_S,
    REACH_POLL_S,
    closed_loop_plan,
    dispatch_offsets,
    in_warmup,
    open_loop_windows,
    stage_at,
)

PROFILE = """name: time_model
description: When does each stage start, reach its level, measure and end?
endpoint: completions
model: auto
seed: 5
classes:
  - name: c
    prompt_tokens: {kind: uniform, min: 64, max: 256}
    output_tokens: {kind: uniform, min: 16, max: 48}
load:
  concurrency: {levels: [2, 150, 40], warmup: 0.5s, hold: 1.2s}
"""
RAMP = """name: time_ramp
description: Does a ramp measure from its start and carry its users over?
endpoint: completions
model: auto
classes:
  - name: c
    prompt_tokens: 64
    output_tokens: 16
load:
  ramp:
    stages:
      - {users: 6, spawn_rate: 4, duration: 2s}
      - {users: 2, spawn_rate: 8, duration: 1.5s}
"""


def _stages(tmp_path: Path, text: str, name: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path, RequestPlanner(load_profile(path)).stages()


def test_locust_dispatches_in_batches_of_the_rate():
    assert dispatch_offsets(5, 100.0) == [0.0] * 5              # under the rate: at once
    assert dispatch_offsets(250, 100.0)[99:101] == [0.0, 1.0]   # 100 a second, in batches
    assert dispatch_offsets(250, 100.0)[-1] == 2.0
    assert dispatch_offsets(3, 2.5) == [0.0, 0.0, 0.8]          # floor(2.5) every 2/2.5 s
    assert dispatch_offsets(2, 0.5) == [0.0, 2.0]


def test_concurrency_levels_are_reached_then_warmed_up_and_end_on_ticks(tmp_path):
    _, stages = _stages(tmp_path, PROFILE, "c")
    windows, users = closed_loop_plan(stages)
    w0, w1, w2 = windows
    # 2 users at once: reached at the watcher's first poll; 1.7 s of warm-up and hold end at
    # 1.75 s, and the stage ends on the next tick.
    assert (w0.start, w0.reached) == (0.0, REACH_POLL_S)
    assert w0.measure_start == pytest.approx(0.55) and w0.measure_end == pytest.approx(1.75)
    assert w0.end == 2.0
    # 148 more users at StageDriver's default rate (100 a second): the second batch at +1 s.
    assert w1.start == 2.0 and w1.reached == pytest.approx(3.0)
    assert w1.measure_start == pytest.approx(3.5) and w1.end == 5.0
    # Down to 40: 110 users stop in batches of 40 a second (the rate is the level), the
    # last at +2 s.
    assert w2.reached == pytest.approx(w2.start + 2 * REACH_POLL_S * 20)
    # Users carry over between stages: 150 users in all, never more than the level at once.
    assert len(users) == 150
    for w, level in zip(windows, (2, 150, 40)):
        t = w.measure_start
        assert sum(1 for u in users if u.start <= t < u.stop) == level
    assert max(u.stop for u in users) == w2.end


def test_ramp_measures_from_its_start_and_cuts_an_unfinished_dispatch(tmp_path):
    _, stages = _stages(tmp_path, RAMP, "r")
    windows, users = closed_loop_plan(stages)
    first, second = windows
    # 6 users at 4 a second: batches at 0, 1 (and the last two at 1 s): reached at 1.0 s.
    assert first.measure_start == 0.0 and first.measure_end == 2.0 and first.end == 2.0
    assert first.reached == pytest.approx(1.0)
    assert second.start == 2.0 and second.measure_end == 3.5 and second.end == 4.0
    assert sum(1 for u in users if u.start <= 3.0 < u.stop) == 2
    assert sorted(u.start for u in users) == [0.0] * 4 + [1.0] * 2


def test_open_loop_stages_start_after_the_lead_and_run_back_to_back(tmp_path):
    text = PROFILE.replace("concurrency: {levels: [2, 150, 40], warmup: 0.5s, hold: 1.2s}",
                           "rate: {rates: [2, 4], warmup: 1s, duration: 3s}")
    _, stages = _stages(tmp_path, text, "o")
    a, b = open_loop_windows(stages)
    assert (a.start, a.measure_start, a.end) == (OPEN_LEAD_S, OPEN_LEAD_S + 1, OPEN_LEAD_S + 4)
    assert b.start == a.end and b.measure_end == b.end == a.end + 4
    assert stage_at([a, b], b.start) is b and stage_at([a, b], 99.0) is b
    assert in_warmup(a, a.measure_start - 1e-6) and not in_warmup(a, a.measure_start)
    assert in_warmup(a, a.measure_end)


def test_predict_follows_the_plan(tmp_path):
    from servelab.cli import main

    path, stages = _stages(tmp_path, PROFILE, "p")
    db = tmp_path / "p.duckdb"
    assert main(["predict", "--variant", "bf16", "--hardware", "H100", "--profile", str(path),
                 "--db", str(db)]) == 0
    windows, _ = closed_loop_plan(stages)
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT stage, reached_unix - started_unix, measure_start_unix - started_unix, "
            "measure_end_unix - started_unix, ended_unix - started_unix FROM stages ORDER BY 1"
        ).fetchall()
        for (stage, reached, m0, m1, end), w in zip(rows, windows):
            assert stage == w.stage
            assert [reached, m0, m1, end] == pytest.approx(
                [w.reached - w.start, w.measure_start - w.start, w.measure_end - w.start,
                 w.end - w.start], abs=1e-6)
        anchor = con.execute("SELECT min(started_unix) FROM stages").fetchone()[0]
        sent = con.execute("SELECT stage, warmup, sent_unix - ?, done_unix - ? FROM requests",
                           [anchor, anchor]).fetchall()
    finally:
        con.close()
    for stage, warmup, t, _ in sent:
        w = stage_at(windows, t)
        assert stage == w.stage and warmup == in_warmup(w, t)   # the stage running when sent
    # In flight at each measured window's start: never more than the level (users carry over;
    # no stage's users overlap the next one's).
    for w, level in zip(windows, (2, 150, 40)):
        t = w.measure_start
        assert sum(1 for _, _, s, d in sent if s <= t < d) <= level
