"""The custom Locust messages between the master and its workers, in the order of a run.

master -> workers: RUN (run id, slots, settings, profile text), STAGE (closed loop: the current
stage, re-sent when it changes), OPEN_STAGES (open loop: every stage's schedule up front), DRAIN
(stop sending, finish, ship), ACK (a batch of rows is stored).
workers -> master: READY (the run context is built, or why not), ROWS (a batch of rows and the
worker's counters), DRAINED (the worker's final counts once all its batches are acknowledged).

A stage travels as ``StageMessage`` (typed here, a plain dict on the wire); where it lies in time
is the stage clock's (``core.stage_clock``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from servelab.core.stage_clock import StageTimes, measured, measured_window

RUN = "servelab_run"
STAGE = "servelab_stage"
OPEN_STAGES = "servelab_open_stages"
DRAIN = "servelab_drain"
ACK = "servelab_ack"
READY = "servelab_ready"
ROWS = "servelab_rows"
DRAINED = "servelab_drained"


@dataclass(frozen=True)
class StageMessage:
    """One stage as the master describes it (STAGE, and each entry of OPEN_STAGES), and as the
    master's stage records, the live view and the workers read it. Locust's msgpack carries only
    plain types, so it travels as ``to_message()``'s dict and is typed again by ``from_message``.

    Times are unix seconds, None where not known yet (a closed-loop level not reached has no
    window). ``start_unix``/``end_unix`` are an open-loop stage's schedule (None: closed loop,
    where the workers stamp rows with the current stage instead). ``version`` orders the
    descriptions of the run's stages (master.stages sets it), so a worker drops an overtaken one.
    """
    stage: int
    kind: str | None = None
    level: float | None = None
    users: int | None = None
    started_unix: float | None = None
    reached_unix: float | None = None
    measure_start_unix: float | None = None
    measure_end_unix: float | None = None
    ended_unix: float | None = None
    start_unix: float | None = None
    end_unix: float | None = None
    max_in_flight: int | None = None
    version: int = 0

    @property
    def open_loop(self) -> bool:
        return self.start_unix is not None

    def in_warmup(self, t_unix: float | None) -> bool:
        """Whether a request sent (or due) at ``t_unix`` is outside the measured window."""
        return not measured(self.measure_start_unix, self.measure_end_unix, t_unix)

    def with_(self, **changes) -> "StageMessage":
        return replace(self, **changes)

    def to_message(self) -> dict:
        return {name: getattr(self, name) for name in _TYPES}

    @classmethod
    def from_message(cls, data: "dict | StageMessage") -> "StageMessage":
        """The typed stage of a message's dict (unknown keys ignored: an older or newer peer)."""
        if isinstance(data, cls):
            return data
        return cls(**{name: _typed(kind, data.get(name)) for name, kind in _TYPES.items()
                      if name in data})

    @classmethod
    def closed(cls, plan, kind: str, started: float, level: float | None = None
               ) -> "StageMessage":
        """A closed-loop stage just asked for: its window is the stage clock's (a ramp's known
        now, a level's once it is reached)."""
        start, end = measured_window(plan, started, None)
        return cls(plan.index, kind, plan.level if level is None else level, plan.users,
                   started, None, start, end)

    @classmethod
    def scheduled(cls, plan, times: StageTimes, kind: str | None = None) -> "StageMessage":
        """An open-loop stage at its place in the stage clock's schedule."""
        return cls(plan.index, kind or plan.kind, plan.level, None, times.start, times.reached,
                   times.measure_start, times.measure_end, None, times.start, times.end,
                   plan.max_in_flight)


def _typed(kind: type, value):
    # msgpack has no int/float distinction for whole numbers: coerce to the field's type.
    return None if value is None else kind(value)


_TYPES = {"stage": int, "kind": str, "level": float, "users": int, "started_unix": float,
          "reached_unix": float, "measure_start_unix": float, "measure_end_unix": float,
          "ended_unix": float, "start_unix": float, "end_unix": float, "max_in_flight": int,
          "version": int}
