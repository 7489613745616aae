"""Open-loop stages (``rate`` and ``trace``): requests leave at their scheduled time.

Every worker computes its share of the stage's seeded arrival schedule (the planner gives item
``k`` to worker ``k % N``) and one dispatcher greenlet sleeps until each arrival's absolute time,
then starts it, whatever earlier requests are doing: the sending never waits for answers, so a
slow server cannot slow the offered load (no coordinated omission).

``max_in_flight`` is split across workers (a semaphore per worker). An arrival that finds the cap
full waits for a slot; if it is sent more than ``late_ms`` after its time it is recorded as
``late``, and one still waiting when the stage ends is recorded as ``dropped``, so latency from
the scheduled time is available for every arrival. Prompts are built ahead of time by a helper
greenlet, so building them is not on the schedule's critical path.
"""
from __future__ import annotations

import bisect
import logging
import time

import gevent
from gevent.lock import BoundedSemaphore
from gevent.pool import Group

from servelab.loadgen.client.clock import to_perf
from servelab.loadgen.messages import StageMessage

log = logging.getLogger("servelab.loadgen")
BUILD_AHEAD = 256
LOOKAHEAD_S = 10.0


def worker_cap(cap: int | None, slot: int, slots: int) -> int | None:
    """This worker's share of a run-wide in-flight cap (at least 1)."""
    if cap is None:
        return None
    share = cap // slots + (1 if slot < cap % slots else 0)
    return max(1, share)


class OpenLoopStage:
    def __init__(self, ctx, stage: StageMessage, final: bool, client=None):
        self.ctx = ctx
        self.stage = stage
        self.final = final
        self.client = client
        arrivals = ctx.planner.arrivals(stage.stage, ctx.slot, ctx.slots)
        # items: a first turn with its arrival time, followed by the session's later turns
        self.items: list[list] = []
        for req in arrivals:
            if req.turn == 1:
                self.items.append([req])
            elif self.items:
                self.items[-1].append(req)
        self.start = to_perf(stage.start_unix)
        self.end = to_perf(stage.end_unix)
        self.due = [self.start + item[0].arrival_s for item in self.items]
        self.cap = worker_cap(stage.max_in_flight, ctx.slot, ctx.slots)
        self.slots = BoundedSemaphore(self.cap) if self.cap else None
        self.late_ms = ctx.settings.late_ms
        self.built: dict[int, object] = {}
        self.handled = 0       # arrivals sent or dropped
        self.sessions = Group()
        self._stopped = False
        self._greenlet = None
        self._done = False
        self._builder = gevent.spawn(self._build_ahead)

    def dispatching(self) -> bool:
        """Started and not through its schedule yet (arrivals still to send or waiting)."""
        return self._greenlet is not None and not self._done

    def backlog(self) -> int:
        """Arrivals that are due but not yet sent."""
        if self._greenlet is None or self._greenlet.dead:
            return 0
        return max(0, bisect.bisect_right(self.due, time.perf_counter()) - self.handled)

    def run(self) -> None:
        """Dispatch the stage in this greenlet; returns when every arrival was handled."""
        self._greenlet = gevent.getcurrent()
        stage = self.stage
        k = 0
        try:
            for k, item in enumerate(self.items):
                due = self.due[k]
                wait = due - time.perf_counter()
                if wait > 0:
                    gevent.sleep(wait)
                if self._stopped:
                    self._drop_rest(k, "the run ended before this arrival was sent")
                    return
                if self.slots is not None and not self.slots.acquire(blocking=False):
                    # Cap reached: wait for a slot, but not past the stage's end (the last
                    # stage waits until the drain deadline stops it).
                    limit = None if self.final else max(0.0, self.end - time.perf_counter())
                    if not self.slots.acquire(timeout=limit):
                        self.ctx.record_dropped(item[0], stage, due, "max_in_flight was reached "
                                                "and no slot freed before the stage ended")
                        self.handled += 1
                        continue
                    if self._stopped:
                        self.slots.release()
                        self._drop_rest(k, "the run ended before this arrival was sent")
                        return
                self.handled += 1
                self.ctx._busy += 1   # until its first request is recorded (see _session)
                self.sessions.spawn(self._session, k, item, due)
        except _Stop:
            self._drop_rest(self.handled, "the run ended before this arrival was sent")
        finally:
            self._done = True
            self._builder.kill(block=False)

    def _drop_rest(self, k: int, why: str) -> None:
        now = time.perf_counter()
        for j in range(k, len(self.items)):
            if self.due[j] > now:
                break  # never due: it was not part of the load that was offered
            self.ctx.record_dropped(self.items[j][0], self.stage, self.due[j], why)
            self.handled += 1

    def _session(self, k: int, item: list, due: float) -> None:
        ctx = self.ctx
        history = None
        try:
            for planned in item:
                if planned.turn > 1:
                    if planned.think_time_s > 0:
                        gevent.sleep(planned.think_time_s)
                    if ctx.draining:
                        return  # a session's later turns are not arrivals: none after the end
                    if self.slots is not None:
                        self.slots.acquire()
                    ctx._busy += 1
                # The turn counts as busy (the drain waits for it) from its dispatch on: a prompt
                # build may yield, and the drain must not report this worker's rows before it.
                try:
                    built = self.built.pop(k, None) if planned.turn == 1 else None
                    if built is None:
                        built = ctx.builder.build(planned, history)
                    more = planned.turn < planned.turns
                    out, reply = ctx.run_request(
                        self.client, planned, built, self.stage,
                        scheduled_perf=due if planned.turn == 1 else None,
                        collect_text=more, late_ms=self.late_ms)
                finally:
                    ctx._busy -= 1
                    if self.slots is not None:
                        self.slots.release()
                if out is None or out.row.error_kind is not None:
                    return
                if more:
                    history = built.history_with(reply)
        except gevent.GreenletExit:
            return

    def _build_ahead(self) -> None:
        # Prompts of the arrivals due in the next LOOKAHEAD_S seconds, and at most BUILD_AHEAD
        # of them, are built ahead; yield between builds so the streams in flight keep their
        # timing.
        for k, item in enumerate(self.items):
            while k - self.handled > BUILD_AHEAD or \
                    self.due[k] - time.perf_counter() > LOOKAHEAD_S:
                gevent.sleep(0.05)
            if k >= self.handled and k not in self.built:
                self.built[k] = self.ctx.builder.build(item[0], None)
            gevent.sleep(0)

    def stop(self) -> None:
        self._stopped = True
        self._builder.kill(block=False)
        if self._greenlet is not None and not self._greenlet.dead:
            # wake the dispatcher from its sleep so it records the waiting arrivals as dropped
            self._greenlet.kill(_Stop(), block=False)

    def join(self, timeout: float) -> None:
        self.sessions.join(timeout=timeout)


class _Stop(gevent.GreenletExit):
    pass
