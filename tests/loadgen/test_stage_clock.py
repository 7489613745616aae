"""One stage message and one stage clock (issue 20): the stage the master sends its workers is a
typed ``StageMessage`` that survives Locust's msgpack transport, and the load generator's shape
(``loadgen.shapes.StageDriver``, driven here on a fake clock with a fake Locust runner) places a
profile's stages where predict's virtual time (``sim.engine.virtual_stages``) does: the same
start, reached, measured window and end for a concurrency sweep, a ramp and open-loop rates."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest

from servelab.core import stage_clock
from servelab.loadgen.messages import StageMessage, _TYPES
from servelab.profiles import load_profile
from servelab.profiles.planner import RequestPlanner
from servelab.sim.engine import virtual_stages
from servelab.sim.engine.virtual_stages import closed_loop_plan, dispatch_offsets, in_warmup

T0 = 1_700_000_000.0
# The fake clock's origin: small, so that its 50 ms polls add up without rounding at 1e9 s.
ORIGIN = 1_000.0
HEAD = """name: clock
description: Where does each stage lie in time?
endpoint: completions
model: auto
seed: 5
classes:
  - name: c
    prompt_tokens: 64
    output_tokens: 16
load:
"""
SWEEP = "  concurrency: {levels: [2, 150, 40], warmup: 0.5s, hold: 1.2s}\n"
RAMP = """  ramp:
    stages:
      - {users: 6, spawn_rate: 4, duration: 2s}
      - {users: 2, spawn_rate: 8, duration: 1.5s}
      - {users: 9, spawn_rate: 50, duration: 3s}
"""
RATES = "  rate: {rates: [2, 4, 3], warmup: 1s, duration: 3s}\n"


def _plans(tmp_path: Path, load: str):
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + load)
    return RequestPlanner(load_profile(path)).stages()


# ---- the message ----------------------------------------------------------------------------
def _wire(data):
    """Locust's transport (locust.rpc.protocol.Message): msgpack, plain types only."""
    return msgpack.loads(msgpack.dumps(("servelab_stage", data, "n")), raw=False,
                         strict_map_key=False)[1]


def test_the_message_names_every_field_once():
    assert set(_TYPES) == {f.name for f in dataclasses.fields(StageMessage)}


@pytest.mark.parametrize("stage", [
    StageMessage(3, "concurrency", 16.0, 16, T0, T0 + 0.05, T0 + 0.55, T0 + 1.75, None,
                 version=7),
    StageMessage(0, "manual", 4.0, 4, T0),
    StageMessage(2, "rate", 2.5, None, T0 + 1, T0 + 1, T0 + 2, T0 + 4, T0 + 4, T0 + 1, T0 + 4,
                 8, 2),
])
def test_the_message_round_trips_locusts_transport(stage):
    data = _wire(stage.to_message())
    assert StageMessage.from_message(data) == stage
    assert StageMessage.from_message(stage) is stage


def test_the_message_is_typed_again_on_arrival():
    # msgpack keeps a whole float's type, but a peer (or a hand-built dict) may send ints
    got = StageMessage.from_message({"stage": 1.0, "level": 4, "users": 4.0, "started_unix": 5,
                                     "version": 2, "a_newer_field": "ignored"})
    assert (got.stage, got.level, got.users, got.started_unix, got.version) == (1, 4.0, 4, 5.0, 2)
    assert type(got.level) is float and type(got.stage) is int and got.kind is None
    assert not got.open_loop and got.in_warmup(6.0)   # not reached: no window, all warm-up


def test_warmup_rule_is_the_virtual_one():
    st = StageMessage(0, "rate", 1.0, None, 10.0, 10.0, 11.0, 14.0, None, 10.0, 14.0)
    w = stage_clock.StageTimes(0, 10.0, 10.0, 11.0, 14.0, 14.0)
    for t in (10.0, 11.0 - 1e-9, 11.0, 13.9, 14.0, 20.0):
        assert st.in_warmup(t) == in_warmup(w, t)
    assert StageMessage(0, "manual", 1.0, 1, 0.0, 1.0, 2.0).in_warmup(1e9) is False  # open end


# ---- the shape on a fake clock, against virtual time ----------------------------------------
class FakeLocust:
    """Locust's user count as its UsersDispatcher moves it (virtual_stages.dispatch_offsets):
    a batch is seen by a poll at or after its time, never by the look at the change itself."""

    def __init__(self):
        self.count, self.moves = 0, []   # (t, from, to, offsets)

    def dispatch(self, t: float, users: int, rate: float) -> None:
        now = self.at(t)
        self.moves.append((t, now, users, dispatch_offsets(abs(users - now), rate)))

    def at(self, t: float) -> int:
        count = 0
        for t0, start, to, offsets in self.moves:
            seen = sum(1 for o in offsets if t > t0 and t0 + o <= t + 1e-9)
            count = start + (seen if to >= start else -seen)
        return count


def _shapes():
    """loadgen.shapes without letting Locust's import monkey-patch this pytest process: a
    pytest-xdist worker waits for its next test on threading's locks, which, patched after its
    start, block forever on gevent's hub ("LoopExit") once another module has used the hub."""
    import os
    import sys

    if "locust" in sys.modules:
        from servelab.loadgen import shapes
        return shapes
    os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"
    try:
        from servelab.loadgen import shapes
    finally:
        del os.environ["LOCUST_SKIP_MONKEY_PATCH"]
    return shapes


def _drive(monkeypatch, plans) -> dict[int, StageMessage]:
    """Run a StageDriver over ``plans`` tick by tick (one a second from ORIGIN); the reach
    watcher runs when spawned, its sleeps moving the clock. Returns each stage's last
    description."""
    shapes = _shapes()
    clock = [ORIGIN]
    locust = FakeLocust()

    class Runner:
        user_count = property(lambda _: locust.at(clock[0]))

    runner = Runner()
    seen: dict[int, StageMessage] = {}
    ended: dict[int, float] = {}
    watchers = []

    def finish(_status):
        collector.finished = True

    collector = SimpleNamespace(
        settings=None, draining=False, active=True, worker_count=1, finished=False,
        wait_ready=lambda: None, drain_and_finish=finish,
        stage_begin=lambda st: seen.__setitem__(st.stage, st),
        stage_end=lambda i, t: ended.setdefault(i, t),
        announce_open_stages=lambda sts: [seen.setdefault(s.stage, s) for s in sts])
    # shapes' own names for the modules, not the modules' functions: time.time and gevent.sleep
    # patched for the whole process would reach the threads pytest-xdist and gevent's
    # threadpool run meanwhile (a worker then lost its hub: "This operation would block forever")
    monkeypatch.setattr(shapes, "time", SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(shapes, "gevent", SimpleNamespace(
        spawn=lambda fn, *a: watchers.append((fn, a)) or SimpleNamespace(kill=lambda block=False: None),
        sleep=lambda s: clock.__setitem__(0, clock[0] + s)))
    driver = shapes.StageDriver(collector, runner, plans, "LLMUser", "OpenLoopUser")
    tick, value = ORIGIN, None
    while not collector.finished:
        clock[0] = tick
        got = driver.tick()
        if got is not None and got != value and plans[0].kind not in stage_clock.OPEN_KINDS:
            value = got
            locust.dispatch(tick, got[0], got[1])
        while watchers:   # the watcher's polls run between this tick and the next
            fn, args = watchers.pop()
            fn(*args)
        tick = stage_clock.next_tick(max(clock[0], tick + 1e-6), ORIGIN)
    return {i: st.with_(ended_unix=ended.get(i)) for i, st in seen.items()}


def _as_windows(stages: dict[int, StageMessage]) -> list[list]:
    return [[st.stage, st.started_unix - ORIGIN, None if st.reached_unix is None else
             st.reached_unix - ORIGIN, st.measure_start_unix - ORIGIN,
             st.measure_end_unix - ORIGIN, st.ended_unix - ORIGIN]
            for _, st in sorted(stages.items())]


def _virtual(windows) -> list[list]:
    return [[w.stage, w.start, w.reached, w.measure_start, w.measure_end, w.end] for w in windows]


@pytest.mark.parametrize("load", [SWEEP, RAMP], ids=["concurrency", "ramp"])
def test_shape_and_virtual_time_place_closed_loop_stages_alike(tmp_path, monkeypatch, load):
    plans = _plans(tmp_path, load)
    real = _as_windows(_drive(monkeypatch, plans))
    virtual = _virtual(closed_loop_plan(plans)[0])
    assert len(real) == len(plans) == len(virtual)
    for r, v in zip(real, virtual):
        assert r == pytest.approx(v, abs=1e-6)


def test_shape_and_virtual_time_place_open_loop_stages_alike(tmp_path, monkeypatch):
    plans = _plans(tmp_path, RATES)
    stages = _drive(monkeypatch, plans)
    virtual = _virtual(virtual_stages.open_loop_windows(plans))
    for r, v in zip(_as_windows(stages), virtual, strict=True):
        assert r == pytest.approx(v, abs=1e-6)
    # a rate stage spans its warm-up and its duration
    assert [st.end_unix - st.start_unix for _, st in sorted(stages.items())] == [4.0] * 3
    assert all(st.open_loop and st.kind == "rate" for st in stages.values())
