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

The windows, ends and open-loop schedule are the stage clock's (``core.stage_clock``), which
``loadgen.shapes`` places its stages by too; the dispatch and the polls mirror Locust 2.x. What
is left out is the scheduling noise of a real process (a tick or a poll a few ms late) and, with
``--workers N``, the master's view of the count, which arrives with the workers' reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.core.stage_clock import (
    OPEN_LEAD_S,
    REACH_POLL_S,
    TICK_S,
    TRACE_PAD_S,
    StageTimes,
    default_spawn_rate,
    measured,
    measured_window,
    next_tick,
    open_schedule,
    over_at,
    spawn_rate,
)

# One stage's times, in seconds from the run's first tick: the stage clock's, as the shape's.
StageWindow = StageTimes
__all__ = ["OPEN_LEAD_S", "REACH_POLL_S", "TICK_S", "TRACE_PAD_S", "StageWindow", "UserSpan",
           "default_spawn_rate", "dispatch_offsets", "closed_loop_plan", "open_loop_windows",
           "stage_at", "in_warmup"]


@dataclass
class UserSpan:
    """A closed-loop user: sends from ``start`` until ``stop`` (the run's end: drained)."""
    start: float
    stop: float


def dispatch_offsets(count: int, rate: float) -> list[float]:
    """Seconds after the dispatch starts at which each of ``count`` users is added or stopped:
    Locust's batches of ``max(1, floor(rate))`` users, ``batch / rate`` seconds apart."""
    batch = max(1, math.floor(rate))
    gap = batch / rate
    return [(i // batch) * gap for i in range(count)]


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
        change = abs(target - len(active))
        offsets = dispatch_offsets(change, spawn_rate(st, workers))
        # No change: the watcher's first look already sees the count.
        reached = _reach_poll(t, t + offsets[-1]) if offsets else t
        measure_start, measure_end = measured_window(st, t, reached)
        end = next_tick(over_at(st, t, measure_end))
        if st.kind == "ramp":
            offsets = [o for o in offsets if t + o < end]   # the rest is cut by the next stage
            if len(offsets) < change:
                reached = None
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
    """Windows of ``rate``/``trace`` stages, back to back from ``OPEN_LEAD_S`` (the schedule is
    announced on the first tick, t = 0)."""
    return open_schedule(stages, 0.0)


def stage_at(windows: list[StageWindow], t: float) -> StageWindow:
    """The stage running at ``t`` (a stage owns [start, end); past the last end: the last)."""
    for w in windows:
        if t < w.end:
            return w
    return windows[-1]


def in_warmup(w: StageWindow, t: float) -> bool:
    """The load generator's rule (the stage clock's): measured only inside the window."""
    return not measured(w.measure_start, w.measure_end, t)
