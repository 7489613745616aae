"""The profile's load plan as a Locust ``LoadTestShape``, and the hand-ramped run's shape.

- ``concurrency``: one level after the other. A level's hold timer starts when Locust reports the
  user count reached (a monitor greenlet polls it every 50 ms), not when the level was asked for;
  its measured window is [reached + warm-up, reached + warm-up + hold).
- ``ramp``: stages of (users, spawn rate, duration), timed from when each was asked for.
- ``rate`` and ``trace``: one ``OpenLoopUser`` per worker; every stage's absolute start time is
  sent to the workers up front (stages follow each other without a gap) and each worker
  dispatches its share of the arrivals on that schedule.
- ``--mode manual`` (``ManualShape``, ``ManualStages``): no plan; the web form's user count,
  changed by hand while it runs, each count a ``manual`` stage.

Each stage's start, reached, measured window and end go to the ``stages`` table as they happen;
the run ends with servelab's drain (see ``master.collector.Collector.drain_and_finish``), then
``tick`` returns None and Locust stops.
"""
from __future__ import annotations

import logging
import time

import gevent
from locust import LoadTestShape

from servelab.core.quantiles import quantile_cont
from servelab.core.stage_clock import (
    OPEN_KINDS,
    REACH_POLL_S,
    measured_window,
    open_schedule,
    over_at,
    spawn_rate,
)
from servelab.loadgen.messages import StageMessage
from servelab.store.runs import mismatched

log = logging.getLogger("servelab.loadgen")
# Where a stage lies in time is the stage clock's (core.stage_clock), which predict's copy of
# this driver (sim.engine.virtual_stages) reads too: virtual and real time cannot drift apart.
REACH_GRACE_S = 30.0     # a level whose users never all report is timed from here on


class StageDriver:
    def __init__(self, collector, runner, stages: list, closed_user, open_user):
        self.collector = collector
        self.runner = runner
        self.stages = stages
        self.kind = stages[0].kind if stages else None
        self.closed_user = closed_user
        self.open_user = open_user
        self.index = -1
        self.current: StageMessage | None = None
        self.value = None
        self.finished = False
        self._monitor = None
        self._open: list[StageMessage] = []
        self._begun: set[int] = set()    # open-loop stages marked begun / ended, by index
        self._ended: set[int] = set()
        collector.plan_stages = stages
        # Mode "search": the plan's levels probed one stage at a time, each picked from the last
        # one's result (loadgen/search_shape.py), with this driver's stage bookkeeping.
        self.search = None
        if getattr(getattr(collector, "settings", None), "mode", None) == "search":
            from servelab.loadgen.search_shape import SearchProbes

            self.search = SearchProbes(self)

    def tick(self):
        if self.search is not None:
            return self.search.tick()
        if self.finished:
            return None
        if self.collector.draining or not self.collector.active:
            return self.value
        if self.index < 0 and not self._open:
            # The first stage waits for every worker's run context (profile, prompt builder),
            # so that no worker starts late.
            self.collector.wait_ready()
        now = time.time()
        if self.kind in OPEN_KINDS:
            return self._tick_open(now)
        return self._tick_closed(now)

    # ---- closed loop ----------------------------------------------------------------------
    def _tick_closed(self, now: float):
        if self.current is None or self._over(now):
            if self.current is not None:
                self.collector.stage_end(self.current.stage, now)
            self.index += 1
            if self.index >= len(self.stages):
                return self._finish()
            self.begin_closed(self.stages[self.index], self.stages[self.index].kind, now)
        return self.value

    def begin_closed(self, plan, kind: str, now: float) -> None:
        """A closed-loop stage asked for now: recorded, watched until reached, users set."""
        if self._monitor is not None:
            self._monitor.kill(block=False)
        self.current = StageMessage.closed(plan, kind, now)
        self.collector.stage_begin(self.current)
        self._monitor = gevent.spawn(self._watch_reached, self.current, plan)
        rate = spawn_rate(plan, self.collector.worker_count)
        self.value = (plan.users or 0, rate, [self.closed_user])

    def _over(self, now: float) -> bool:
        st = self.current
        over = over_at(self.stages[self.index], st.started_unix, st.measure_end_unix)
        return over is not None and now >= over

    def _watch_reached(self, stage: StageMessage, plan) -> None:
        target = plan.users or 0
        rate = plan.spawn_rate or float("inf")
        give_up = stage.started_unix + target / rate + REACH_GRACE_S \
            if rate != float("inf") else stage.started_unix + REACH_GRACE_S
        while self.runner.user_count != target:
            if time.time() > give_up:
                log.warning("servelab: stage %d: %s of %d users reported after %.0f s; timing "
                            "the level from now", plan.index, self.runner.user_count, target,
                            time.time() - stage.started_unix)
                break
            gevent.sleep(REACH_POLL_S)
        if self.current is None or self.current.stage != stage.stage:
            return
        reached = time.time()
        start, end = measured_window(plan, stage.started_unix, reached)
        self.current = self.current.with_(reached_unix=reached, measure_start_unix=start,
                                          measure_end_unix=end)
        self.collector.stage_begin(self.current)

    # ---- open loop ------------------------------------------------------------------------
    def _tick_open(self, now: float):
        if not self._open:
            self.announce_open(self.stages, now)
        for st in self._open:
            self.mark_open(st, now)
        if now >= self._open[-1].end_unix:
            return self._finish()
        return self.value

    def announce_open(self, plans: list, now: float, kind: str | None = None) -> None:
        """Open-loop stages placed by the stage clock from now, sent to the workers up front."""
        announced = [StageMessage.scheduled(p, t, kind)
                     for p, t in zip(plans, open_schedule(plans, now))]
        self.collector.announce_open_stages(announced)
        self._open.extend(announced)
        workers = max(1, self.collector.worker_count)
        self.value = (workers, float(workers), [self.open_user])

    def mark_open(self, st: StageMessage, now: float) -> None:
        """An open-loop stage's start and end in the stages table, once each, when due."""
        if st.start_unix <= now and st.stage not in self._begun:
            self._begun.add(st.stage)
            self.collector.stage_begin(st)
        if st.end_unix <= now and st.stage in self._begun and st.stage not in self._ended:
            self._ended.add(st.stage)
            self.collector.stage_end(st.stage, st.end_unix)

    # ---- the end --------------------------------------------------------------------------
    def _finish(self):
        self.finished = True
        if self._monitor is not None:
            self._monitor.kill(block=False)
        self.collector.drain_and_finish("completed")
        return None

    def stop(self) -> None:
        """Locust is stopping the run early (web UI Stop, Ctrl-C): close the current stage; a
        measured window cut short ends now, so rates are over the time really measured."""
        now = time.time()
        if self._monitor is not None:
            self._monitor.kill(block=False)
        cur = self.current
        if cur is not None and not self.finished:
            if cur.measure_end_unix is not None and cur.measure_end_unix > now:
                self.collector.stage_begin(cur.with_(measure_end_unix=max(
                    now, cur.measure_start_unix)))
            self.collector.stage_end(cur.stage, now)
        for st in self._open:
            if st.stage in self._begun and st.stage not in self._ended:
                self._ended.add(st.stage)
                if st.measure_end_unix > now:
                    self.collector.stage_begin(st.with_(
                        measure_end_unix=max(now, st.measure_start_unix)))
                self.collector.stage_end(st.stage, min(now, st.end_unix))


class ManualStages:
    """A run ramped by hand (``--mode manual``). The user count and spawn rate are the web form's:
    Locust's ``/swarm`` writes them into ``parsed_options`` on every post, the Edit form's too
    (it refuses to restart a running shape, but only after writing them). Each new count asked
    for is a ``manual`` stage; its level is the number of ``LLMUser`` really running once Locust
    reports them all, and its measured window is [reached + ``--manual-warmup``, next change or
    stop). The level is checked against what the workers have in flight (their health samples):
    a closed-loop user has at most one request in flight, so a level far from it means users
    that do not send (the old bug: 8 asked, 4 sending)."""

    def __init__(self, collector, runner, options, warmup_s: float, closed_user,
                 idles: bool = False):
        self.collector = collector
        self.idles = idles     # the profile has think time (store.runs.may_idle)
        self.runner = runner
        self.options = options
        self.warmup_s = warmup_s
        self.closed_user = closed_user
        self.index = -1
        self.asked: int | None = None
        self.current: StageMessage | None = None
        self.value = None
        self.started: float | None = None
        self.finished = False
        self._monitor = None
        self._samples: dict[str, list[int]] = {}   # this stage's in-flight samples, by worker
        self._warned = -1

    def tick(self):
        if self.finished:
            return None
        if self.collector.draining or not self.collector.active:
            return self.value
        now = time.time()
        # --run-time (or the form's Run time): Locust's own timer is not armed for a shape.
        limit = getattr(self.options, "run_time", None)
        if limit and self.started is not None and now - self.started >= float(limit):
            self.finished = True
            self._close(now)
            self.collector.drain_and_finish("completed")
            return None
        users = max(0, int(getattr(self.options, "num_users", 0) or 0))
        rate = float(getattr(self.options, "spawn_rate", 0) or 0) or 1.0
        if users != self.asked:
            if self.asked is None:
                self.collector.wait_ready()   # as the plan does: no worker starts late
                self.started = time.time()
            self._next(users, time.time())
        # Only closed-loop users: OpenLoopUser's dispatcher sends nothing in a manual run.
        self.value = (users, rate, [self.closed_user])
        return self.value

    def _next(self, users: int, now: float) -> None:
        self._close(now)
        self.asked = users
        self.index += 1
        self.current = StageMessage(self.index, "manual", float(users), users, now)
        self._samples = {}
        self.collector.stage_begin(self.current)
        self._monitor = gevent.spawn(self._watch_reached, self.index, users, now)

    def running(self) -> int:
        """``LLMUser`` instances Locust reports running (on a master: the workers' reports)."""
        # A master's own user_classes_count is its own (none); the workers' is "reported".
        counts = getattr(self.runner, "reported_user_classes_count", None)
        if counts is None:
            counts = self.runner.user_classes_count
        return int(counts.get(self.closed_user.__name__, 0))

    def _watch_reached(self, index: int, users: int, asked_unix: float) -> None:
        rate = float(getattr(self.options, "spawn_rate", 0) or 0) or 1.0
        give_up = asked_unix + users / rate + REACH_GRACE_S
        while not (self.running() == users and self.runner.user_count == users):
            if time.time() > give_up:
                log.warning("servelab: manual stage %d: %d of %d users running after %.0f s; "
                            "recording the level that runs", index, self.running(), users,
                            time.time() - asked_unix)
                break
            gevent.sleep(REACH_POLL_S)
        cur = self.current
        if cur is None or cur.stage != index:
            return
        reached = time.time()
        # No plan: the window is open-ended, from the warm-up's end to the next change or stop.
        self.current = cur.with_(reached_unix=reached, level=float(self.running()),
                                 measure_start_unix=reached + self.warmup_s)
        self.collector.stage_begin(self.current)

    def observe(self, worker: str, t_unix: float, in_flight) -> None:
        """One health sample of a worker (the master reads the last one of each batch)."""
        cur = self.current
        if cur is None or in_flight is None or cur.measure_start_unix is None or \
                t_unix < cur.measure_start_unix:
            return
        self._samples.setdefault(worker, []).append(int(in_flight))
        verdict = self.check()
        if verdict["mismatch"] and self._warned != cur.stage:
            self._warned = cur.stage
            log.warning("servelab: manual stage %d: level %g users but %g requests in flight",
                        cur.stage, verdict["level"], verdict["in_flight"])

    def check(self) -> dict:
        """The current stage's level against the generator's in-flight count: the sum over
        workers of each one's median sample in the measured window (workers sample on their own
        clocks, so per-second sums would mix phases). Same rule as ``store.runs`` at the end."""
        cur = self.current
        in_flight = None
        if self._samples:
            in_flight = float(sum(quantile_cont(v, 0.5) for v in self._samples.values()))
        level = None if cur is None else cur.level
        start = None if cur is None else cur.measure_start_unix
        return {"stage": None if cur is None else cur.stage, "level": level,
                "in_flight": in_flight, "samples": sum(len(v) for v in self._samples.values()),
                "measuring": start is not None and time.time() >= start,
                "mismatch": mismatched(level, in_flight, self.idles)}

    def _close(self, now: float) -> None:
        if self._monitor is not None:
            self._monitor.kill(block=False)
        cur = self.current
        if cur is None:
            return
        start = cur.measure_start_unix
        if start is not None:
            # Still in its warm-up: an empty window, not one that reaches back before it.
            self.collector.stage_begin(cur.with_(measure_end_unix=max(now, start)))
        self.collector.stage_end(cur.stage, now)
        self.current = None

    def stop(self) -> None:
        self._close(time.time())


class ManualShape(LoadTestShape):
    """``--mode manual`` (or the form's mode): the users and spawn rate of the form, changed while
    it runs with Edit; ``ticks`` is the plugin's (``plugin.MasterSide``)."""

    use_common_options = True
    ticks = None

    def tick(self):
        return self.ticks() if self.ticks is not None else None


class ProfileShape(LoadTestShape):
    """The profile's load plan (``--profile``); see the module docstring.

    ``ticks`` is handed to the shape by the plugin when Locust starts (``plugin.MasterSide``):
    it starts the run on the first tick and answers with its ``StageDriver``'s tick. The form's
    user fields stay editable (the same form serves both modes; the mode's help says the plan
    ignores them)."""

    use_common_options = True
    ticks = None

    def tick(self):
        return self.ticks() if self.ticks is not None else None
