"""The profile's load plan as a Locust ``LoadTestShape`` (and stage tracking for hand-ramped runs).

- ``concurrency``: one level after the other. A level's hold timer starts when Locust reports the
  user count reached (a monitor greenlet polls it every 50 ms), not when the level was asked for;
  its measured window is [reached + warm-up, reached + warm-up + hold).
- ``ramp``: stages of (users, spawn rate, duration), timed from when each was asked for.
- ``rate`` and ``trace``: one ``OpenLoopUser`` per worker; every stage's absolute start time is
  sent to the workers up front (stages follow each other without a gap) and each worker
  dispatches its share of the arrivals on that schedule.

Each stage's start, reached, measured window and end go to the ``stages`` table as they happen;
the run ends with servelab's drain (see ``master.collector.Collector.drain_and_finish``), then
``tick`` returns None and Locust stops.
"""
from __future__ import annotations

import logging
import time

import gevent
from locust import LoadTestShape

log = logging.getLogger("servelab.loadgen")
OPEN_LEAD_S = 1.0        # open-loop schedules start this long after they are announced
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
        self.current: dict | None = None
        self.value = None
        self.finished = False
        self._monitor = None
        self._open: list[dict] = []
        collector.plan_stages = stages

    def tick(self):
        if self.finished:
            return None
        if self.collector.draining or not self.collector.active:
            return self.value
        if self.index < 0 and not self._open:
            # The first stage waits for every worker's run context (profile, prompt builder),
            # so that no worker starts late.
            self.collector.wait_ready()
        now = time.time()
        if self.kind in ("rate", "trace"):
            return self._tick_open(now)
        return self._tick_closed(now)

    # ---- closed loop ----------------------------------------------------------------------
    def _tick_closed(self, now: float):
        if self.current is None or self._over(now):
            if self.current is not None:
                self.collector.stage_end(self.current["stage"], now)
            self.index += 1
            if self.index >= len(self.stages):
                return self._finish()
            plan = self.stages[self.index]
            stage = {"stage": plan.index, "kind": plan.kind, "level": plan.level,
                     "users": plan.users, "started_unix": now, "reached_unix": None,
                     "measure_start_unix": None, "measure_end_unix": None,
                     "ended_unix": None}
            if plan.kind == "ramp":
                stage["measure_start_unix"] = now + plan.warmup_s
                stage["measure_end_unix"] = now + plan.duration_s
            self.current = stage
            self.collector.stage_begin(stage)
            self._monitor = gevent.spawn(self._watch_reached, dict(stage), plan)
            workers = max(1, self.collector.worker_count)
            rate = plan.spawn_rate or max(1.0, min(float(plan.users or 1), 100.0 * workers))
            self.value = (plan.users or 0, rate, [self.closed_user])
        return self.value

    def _over(self, now: float) -> bool:
        st = self.current
        plan = self.stages[self.index]
        if plan.kind == "ramp":
            return now >= st["started_unix"] + plan.duration_s
        if st["measure_end_unix"] is None:
            return False
        return now >= st["measure_end_unix"]

    def _watch_reached(self, stage: dict, plan) -> None:
        target = plan.users or 0
        rate = plan.spawn_rate or float("inf")
        give_up = stage["started_unix"] + target / rate + REACH_GRACE_S \
            if rate != float("inf") else stage["started_unix"] + REACH_GRACE_S
        while self.runner.user_count != target:
            if time.time() > give_up:
                log.warning("servelab: stage %d: %s of %d users reported after %.0f s; timing "
                            "the level from now", plan.index, self.runner.user_count, target,
                            time.time() - stage["started_unix"])
                break
            gevent.sleep(0.05)
        if self.current is None or self.current["stage"] != stage["stage"]:
            return
        reached = time.time()
        self.current = dict(self.current, reached_unix=reached)
        if plan.kind == "concurrency":
            self.current["measure_start_unix"] = reached + plan.warmup_s
            self.current["measure_end_unix"] = reached + plan.warmup_s + plan.hold_s
        self.collector.stage_begin(self.current)

    # ---- open loop ------------------------------------------------------------------------
    def _tick_open(self, now: float):
        if not self._open:
            t = now + OPEN_LEAD_S
            for plan in self.stages:
                span = plan.duration_s
                if plan.kind == "trace":
                    span += 0.001  # the last trace arrival falls on the span itself
                self._open.append({
                    "stage": plan.index, "kind": plan.kind, "level": plan.level,
                    "start_unix": t, "end_unix": t + span, "started_unix": t,
                    "reached_unix": t, "measure_start_unix": t + plan.warmup_s,
                    "measure_end_unix": t + span, "ended_unix": None,
                    "max_in_flight": plan.max_in_flight})
                t += span
            self.collector.announce_open_stages(self._open)
            workers = max(1, self.collector.worker_count)
            self.value = (workers, float(workers), [self.open_user])
        for st in self._open:
            if st["start_unix"] <= now and st.get("_begun") is None:
                st["_begun"] = True
                self.collector.stage_begin({k: v for k, v in st.items() if k != "_begun"})
            if st["end_unix"] <= now and st.get("_ended") is None and st.get("_begun"):
                st["_ended"] = True
                self.collector.stage_end(st["stage"], st["end_unix"])
        if now >= self._open[-1]["end_unix"]:
            return self._finish()
        return self.value

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
            if cur.get("measure_end_unix") is not None and cur["measure_end_unix"] > now:
                self.collector.stage_begin(dict(cur, measure_end_unix=max(
                    now, cur["measure_start_unix"])))
            self.collector.stage_end(cur["stage"], now)
        for st in self._open:
            if st.get("_begun") and not st.get("_ended"):
                st["_ended"] = True
                if st["measure_end_unix"] > now:
                    self.collector.stage_begin(dict(
                        {k: v for k, v in st.items() if not k.startswith("_")},
                        measure_end_unix=max(now, st["measure_start_unix"])))
                self.collector.stage_end(st["stage"], min(now, st["end_unix"]))


class ManualStages:
    """A run ramped by hand (web UI without the profile's shape): each new user count asked for
    is a ``ramp`` stage whose level is that count, measured from when it was reached."""

    def __init__(self, collector, runner):
        self.collector = collector
        self.runner = runner
        self.index = -1
        self.current: dict | None = None
        self._greenlet = gevent.spawn(self._loop)

    def _loop(self) -> None:
        target = None
        while True:
            want = getattr(self.runner, "target_user_count", None)
            now = time.time()
            if want is not None and want != target:
                target = want
                if self.current is not None:
                    if self.current.get("measure_start_unix") is not None:
                        self.collector.stage_begin(dict(self.current, measure_end_unix=now))
                    self.collector.stage_end(self.current["stage"], now)
                self.index += 1
                self.current = {"stage": self.index, "kind": "ramp", "level": float(want),
                                "started_unix": now, "reached_unix": None,
                                "measure_start_unix": None, "measure_end_unix": None,
                                "ended_unix": None}
                self.collector.stage_begin(self.current)
            cur = self.current
            if cur is not None and cur["reached_unix"] is None and \
                    self.runner.user_count == target:
                self.current = dict(cur, reached_unix=now, measure_start_unix=now,
                                    measure_end_unix=None)
                self.collector.stage_begin(self.current)
            gevent.sleep(0.25)

    def stop(self) -> None:
        self._greenlet.kill(block=False)
        if self.current is not None:
            now = time.time()
            if self.current.get("measure_start_unix") is not None:
                self.current = dict(self.current, measure_end_unix=now)
                self.collector.stage_begin(self.current)
            self.collector.stage_end(self.current["stage"], now)


class ProfileShape(LoadTestShape):
    """The profile's load plan (``--profile``); see the module docstring.

    ``ticks`` is handed to the shape by the plugin when Locust starts (``plugin.MasterSide``):
    it starts the run on the first tick and answers with its ``StageDriver``'s tick."""

    ticks = None

    def tick(self):
        return self.ticks() if self.ticks is not None else None
