"""The stage clock: where each stage of a profile's load plan lies in time, the one rule that the
load generator's shape (``loadgen.shapes``, real time) and predict's plan
(``sim.engine.virtual_stages``, virtual time) both place stages by. It lives in core because
both may import core and neither may import the other (tests/test_layers.py's ALLOWED).

What each side adds is only how it learns a moment: the shape reads the wall clock and Locust's
user count; virtual time computes Locust's dispatch and the watcher's polls. Given the moments a
stage was asked for and reached, its measured window, its end and the open-loop schedule come
from here:

- ``ramp``: measured [start + warm-up, start + duration), timed from when it was asked for;
  over at start + duration.
- ``concurrency`` (and a search probe of one): measured [reached + warm-up, reached + warm-up +
  hold), nothing before the level is reached; over when the window ends.
- A closed-loop stage ends on the first shape tick (``TICK_S``) at or after it is over.
- ``rate`` and ``trace``: back to back from ``OPEN_LEAD_S`` after the schedule is announced, each
  one's span its duration (a trace's gains ``TRACE_PAD_S``, so its last arrival falls inside);
  measured from start + warm-up to its end.
- A request counts (is not warm-up) iff it was sent in [measure_start, measure_end).

A plan is anything with a profile ``StagePlan``'s fields (index, kind, users, spawn_rate,
warmup_s, hold_s, duration_s): core does not import profiles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.core.timeouts import OPEN_LEAD_S, REACH_POLL_S, SPAWN_RATE_CAP

TICK_S = 1.0           # Locust's shape worker: one tick per second
TRACE_PAD_S = 0.001    # a trace stage's span gains this, so its last arrival is inside it
OPEN_KINDS = ("rate", "trace")
__all__ = ["OPEN_KINDS", "OPEN_LEAD_S", "REACH_POLL_S", "SPAWN_RATE_CAP", "TICK_S",
           "TRACE_PAD_S", "StageTimes", "default_spawn_rate", "spawn_rate", "measured_window",
           "over_at", "next_tick", "span_s", "open_schedule", "measured"]


@dataclass
class StageTimes:
    """One stage's moments on one clock (unix seconds, or seconds from a virtual run's first
    tick); ``reached`` None: never reached, a window or end None: not known yet."""
    stage: int
    start: float
    reached: float | None
    measure_start: float | None
    measure_end: float | None
    end: float | None

    def as_dict(self) -> dict:
        return {"stage": self.stage, "start": self.start, "reached": self.reached,
                "measure_start": self.measure_start, "measure_end": self.measure_end,
                "end": self.end}


def default_spawn_rate(users: int | None, workers: int = 1) -> float:
    """The shape's spawn rate when the plan sets none: the level, at most ``SPAWN_RATE_CAP``
    users a second per worker, at least 1."""
    return max(1.0, min(float(users or 1), SPAWN_RATE_CAP * max(1, workers)))


def spawn_rate(plan, workers: int = 1) -> float:
    return plan.spawn_rate or default_spawn_rate(plan.users, workers)


def measured_window(plan, started: float, reached: float | None
                    ) -> tuple[float | None, float | None]:
    """A closed-loop stage's measured window (None, None: not reached yet, so not known)."""
    if plan.kind == "ramp":
        return started + plan.warmup_s, started + plan.duration_s
    if reached is None:
        return None, None
    return reached + plan.warmup_s, reached + plan.warmup_s + plan.hold_s


def over_at(plan, started: float, measure_end: float | None) -> float | None:
    """When a closed-loop stage is over (None: not known yet); it ends on the next tick."""
    if plan.kind == "ramp":
        return started + plan.duration_s
    return measure_end


def next_tick(t: float, first_tick: float = 0.0) -> float:
    """The first shape tick at or after ``t`` (ticks every ``TICK_S`` from ``first_tick``)."""
    return first_tick + math.ceil((t - first_tick) / TICK_S - 1e-9) * TICK_S


def span_s(plan) -> float:
    """An open-loop stage's span: its duration, a trace's with ``TRACE_PAD_S``."""
    return plan.duration_s + (TRACE_PAD_S if plan.kind == "trace" else 0.0)


def open_schedule(plans: list, announced: float) -> list[StageTimes]:
    """Open-loop stages back to back, the first ``OPEN_LEAD_S`` after ``announced``."""
    out, t = [], announced + OPEN_LEAD_S
    for plan in plans:
        span = span_s(plan)
        out.append(StageTimes(plan.index, t, t, t + plan.warmup_s, t + span, t + span))
        t += span
    return out


def measured(measure_start: float | None, measure_end: float | None, t: float | None) -> bool:
    """The warm-up rule: measured only inside [measure_start, measure_end); an unknown start
    (not reached yet) is warm-up, an unknown end (a manual stage running on) is open."""
    if t is None or measure_start is None:
        return False
    return measure_start <= t and (measure_end is None or t < measure_end)
