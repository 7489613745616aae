"""The load generator's stage plan in virtual time: when each stage starts, is reached, measures
and ends, and when each closed-loop user lives, as ``servelab run`` does it in real time.

``servelab predict`` and a measured run must time a profile the same way, or their stage figures
differ for reasons that have nothing to do with the server (issue 13: TTFT 0.38-2.56x between
them when predict started every user at t=0 and measured from t=0). So this module follows the
real path step by step, with ``--workers 0`` (one Locust process, ``LocalRunner``):

- Locust's shape worker calls ``StageDriver.tick`` once a second (``TICK_S``); a stage can only
  end on a tick, so a stage lasts until the first tick at or after its measured window's end.
- A new user count is dispatched by Locust's ``UsersDispatcher``: batches of
  ``max(1, floor(rate))`` users, one batch every ``batch / rate`` seconds, the first at once.
  The rate is the stage's ``spawn_rate``, else ``StageDriver``'s default (the level, at most
  ``SPAWN_RATE_CAP`` per worker, at least 1). Users carry over from stage to stage; a lower count
  stops the newest users, in batches at the same pace. A dispatch still going when the next stage
  starts is cut there, as Locust kills its spawning greenlet.
- ``StageDriver._watch_reached`` polls the user count every ``REACH_POLL_S``: a concurrency
  stage is reached at the first poll that sees every user, then measures ``warmup_s`` later for
  ``hold_s``. A ramp stage measures from its start (after ``warmup_s``) to ``duration_s``.
- Open-loop (``rate``, ``trace``) schedules start ``OPEN_LEAD_S`` after the first tick and run
  back to back; each stage ends exactly at its span (a trace's span gains 1 ms so that its last
  arrival falls inside it).

These constants mirror ``loadgen.shapes`` and Locust 2.x; what is left out is the scheduling
noise of a real process (a tick or a poll a few ms late) and, with ``--workers N``, the master's
view of the count, which arrives with the workers' reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.core.timeouts import OPEN_LEAD_S, REACH_POLL_S, SPAWN_RATE_CAP

TICK_S = 1.0           # Locust's shape worker: one tick per second
TRACE_PAD_S = 0.001    # a trace stage's span gains this, so its last arrival is inside it


@dataclass
class StageWindow:
    """One stage's times, in seconds from the run's first tick (``reached`` None: never)."""
    stage: int
    start: float
    reached: float | None
    measure_start: float
    measure_end: float
    end: float

    def as_dict(self) -> dict:
        return {"stage": self.stage, "start": self.start, "reached": self.reached,
                "measure_start": self.measure_start, "measure_end": self.measure_end,
                "end": self.end}


@dataclass
class UserSpan:
    """A closed-loop user: sends from ``start`` until ``stop`` (the run's end: drained)."""
    start: float
    stop: float


def default_spawn_rate(users: int, workers: int = 1) -> float:
    return max(1.0, min(float(users or 1), SPAWN_RATE_CAP * max(1, workers)))


def dispatch_offsets(count: int, rate: float) -> list[float]:
    """Seconds after the dispatch starts at which each of ``count`` users is added or stopped:
    Locust's batches of ``max(1, floor(rate))`` users, ``batch / rate`` seconds apart."""
    batch = max(1, math.floor(rate))
    gap = batch / rate
    return [(i // batch) * gap for i in range(count)]


def _next_tick(t: float) -> float:
    return math.ceil(t / TICK_S - 1e-9) * TICK_S


def _reach_poll(start: float, last_change: float) -> float:
    """The poll of the user count that first sees the dispatch's last batch. The watcher looks
    before Locust's first batch, so it takes one poll at least; its polls drift a little late
    (each sleep plus the check), so a batch due on a poll's time is seen by that poll."""
    polls = max(1, math.ceil((last_change - start) / REACH_POLL_S - 1e-9))
    return start + polls * REACH_POLL_S


def closed_loop_plan(stages: list, workers: int = 1) -> tuple[list[StageWindow], list[UserSpan]]:
    """Windows of ``concurrency``/``ramp`` stages and the users' lifetimes."""
    windows: list[StageWindow] = []
    active: list[float] = []       # start times of running users, oldest first
    spans: list[UserSpan] = []
    t = 0.0
    for st in stages:
        target = st.users or 0
        rate = st.spawn_rate or default_spawn_rate(target, workers)
        change = abs(target - len(active))
        offsets = dispatch_offsets(change, rate)
        # No change: the watcher's first look already sees the count.
        reached = _reach_poll(t, t + offsets[-1]) if offsets else t
        if st.kind == "ramp":
            end = _next_tick(t + st.duration_s)
            measure_start, measure_end = t + st.warmup_s, t + st.duration_s
            offsets = [o for o in offsets if t + o < end]   # the rest is cut by the next stage
            if len(offsets) < change:
                reached = None
        else:
            measure_start = reached + st.warmup_s
            measure_end = measure_start + st.hold_s
            end = _next_tick(measure_end)
        for o in offsets:
            if target > len(active):
                active.append(t + o)
            else:
                spans.append(UserSpan(active.pop(), t + o))
        windows.append(StageWindow(st.index, t, reached, measure_start, measure_end, end))
        t = end
    spans.extend(UserSpan(s, t) for s in active)   # the run's end: no new requests, drained
    spans.sort(key=lambda s: s.start)
    return windows, spans


def open_loop_windows(stages: list) -> list[StageWindow]:
    """Windows of ``rate``/``trace`` stages, back to back from ``OPEN_LEAD_S``."""
    out, t = [], OPEN_LEAD_S
    for st in stages:
        span = st.duration_s + (TRACE_PAD_S if st.kind == "trace" else 0.0)
        out.append(StageWindow(st.index, t, t, t + st.warmup_s, t + span, t + span))
        t += span
    return out


def stage_at(windows: list[StageWindow], t: float) -> StageWindow:
    """The stage running at ``t`` (a stage owns [start, end); past the last end: the last)."""
    for w in windows:
        if t < w.end:
            return w
    return windows[-1]


def in_warmup(w: StageWindow, t: float) -> bool:
    """The load generator's rule (worker.context._in_warmup): measured only inside the window."""
    return not (w.measure_start <= t < w.measure_end)
