"""The plan mode ``search`` (``--mode search``, ``servelab search``): the plan's levels probed one
stage at a time, each level chosen from the last probe's result by ``loadgen.search_rules``, all
of them stages (kind ``search``) of one run, so summary, compare and report read them as any.

A probe runs as a plan stage does (closed loop: users reached, warm-up, hold; open loop: its
arrivals, announced alone) and its stage ends with its measured window. Then it waits to be
*settled*: every request sent in the window stored (its slowest requests are the ones that
decide), and every worker's health samples up to the stage's end (the saturation verdict reads
them), so the master's verdict is the one any later reader of the stored run gets. A closed-loop
level keeps running meanwhile, so its last requests finish under the load they were measured at
(what is sent then belongs to no window); an open-loop probe's arrivals have ended. Then the
probe is judged by the stored rows (``search_reads.read_probe``: stage_summary's attainment,
store.runs' saturation verdict) and the next level picked.

The stage bookkeeping is the plan's ``shapes.StageDriver``'s, which hands its ticks here in this
mode: its ``current`` (closed loop) and ``_open`` (open loop) stages, its users, its stop (a
window cut short ends then) and its finish (servelab's drain).

Stage indices only grow (workers and the live view take a lower index for an older stage).
Closed loop: 0, 1, 2 ...; open loop: the next index naming the probe's rate in the plan
(``search_rules.stage_index``), because a worker knows an open-loop stage only by its index and
the planner repeats the rates past the plan's end.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

from servelab.loadgen.search_reads import health_until, read_probe, settled_workers
from servelab.loadgen.search_rules import KIND, STOPS, Bisection, stage_index, start_position

log = logging.getLogger("servelab.loadgen")
# A worker whose counters say it has nothing in flight is settled only once a batch sent after
# the cutoff can have arrived (batches go every 0.25 s, with a health sample every second).
COUNTERS_FRESH_S = 2.0
SETTLE_SLACK_S = 30.0   # past the request timeout: the last rows' way to the database
HEALTH_WAIT_S = 10.0    # a worker samples its health every second, shipped within a second


class SearchProbes:
    """The search's side of a ``StageDriver`` in mode search: which level next, and when."""

    def __init__(self, driver):
        self.d = driver
        stages, settings = driver.stages, driver.collector.settings
        self.plan = list(stages)
        # position (ascending level) -> the plan's stage index, whatever order the plan lists
        self.order = sorted(range(len(stages)), key=lambda i: stages[i].level or 0.0)
        self.levels = [float(stages[i].level or 0.0) for i in self.order]
        self.target = float(settings.search_target)
        self.max_error_rate = float(settings.search_max_error_rate)
        self.settle_limit_s = settings.timeouts.total_s + SETTLE_SLACK_S
        self.search = Bisection(self.levels, start_position(self.levels, settings.search_start))
        self.probes = []          # the probes' StagePlans, in order
        self.positions: list[int] = []
        self.ended: float | None = None   # the current probe's end, while it waits to be judged
        self.unit = "requests/s" if driver.kind == "rate" else "users"

    def problem(self) -> str | None:
        """Why this plan cannot be searched (the web form and ``servelab search`` refuse it
        first; this is the last line)."""
        if self.d.kind not in ("concurrency", "rate"):
            return (f"mode search needs a concurrency or rate plan (its levels are what is "
                    f"searched); this profile's plan is {self.d.kind}")
        if not 0.0 < self.target < 1.0:
            return f"--search-target {self.target:g}: give a share between 0 and 1, e.g. 0.95"
        return None

    def tick(self):
        d = self.d
        if d.finished:
            return None
        if d.collector.draining or not d.collector.active:
            return d.value
        if not self.probes:
            why = self.problem()
            if why is not None:
                log.error("servelab: %s", why)
                return self._give_up()
            d.collector.wait_ready()
            return self._begin(time.time(), self.search.next_position())
        now = time.time()
        self._open_marks(now)
        if self.ended is None:
            cutoff = self._cutoff()
            if cutoff is None or now < cutoff:
                return d.value
            # The stage ends with its window; it is judged once every request sent in the
            # window and the health samples up to its end are stored, so the verdict is the one
            # any later reader of the stored run gets. A closed-loop level runs on meanwhile:
            # those requests belong to no window, their stage's or the next one's.
            self.ended = cutoff
            if d.current is not None:
                d.collector.stage_end(d.current.stage, cutoff)
        settled = self._settled(self.ended, now)   # both asked every tick: they overlap
        if not (self._health_stored(now) and settled):
            return d.value
        try:
            self._judge()
        except Exception as exc:  # noqa: BLE001 - a failed read ends the search, not the run
            log.error("servelab: search: reading probe %d failed (%s: %s); stopping",
                      len(self.probes), type(exc).__name__, exc)
            return self._give_up()
        self.ended = None
        position = self.search.next_position()
        if position is None:
            a = self.search.answer()
            log.info("servelab: search stopped after %d probes: %s; limit %s %s (interval %s-%s)",
                     len(self.probes), STOPS.get(self.search.stop, self.search.stop),
                     "-" if a.limit is None else f"{a.limit:g}", self.unit, a.low, a.high)
            return d._finish()
        return self._begin(now, position)

    def _give_up(self):
        d = self.d
        d.finished = True
        if d.current is not None:
            d.collector.stage_end(d.current.stage, time.time())
        d.collector.drain_and_finish("failed")
        return None

    # ---- one probe --------------------------------------------------------------------------
    def _begin(self, now: float, position: int):
        plan_index = self.order[position]
        last = self.probes[-1].index if self.probes else None
        index = stage_index(last, plan_index, len(self.plan), cyclic=self.d.kind == "rate")
        plan = replace(self.plan[plan_index], index=index)
        self.probes.append(plan)
        self.positions.append(position)
        log.info("servelab: search probe %d: stage %d at %g %s", len(self.probes), index,
                 plan.level, self.unit)
        if self.d.kind == "rate":
            return self._begin_open(now, plan)
        return self._begin_closed(now, plan)

    def _begin_closed(self, now: float, plan):
        # As StageDriver._tick_closed begins a concurrency stage, with the stage's kind 'search'.
        self.d.begin_closed(plan, KIND, now)
        return self.d.value

    def _begin_open(self, now: float, plan):
        # Announced alone: the next probe's rate is not known until this one is judged.
        self.d.announce_open([plan], now, KIND)
        return self.d.value

    def _open_marks(self, now: float) -> None:
        """An open-loop probe's start and end in the stages table, as StageDriver marks them."""
        if self.d._open:
            self.d.mark_open(self.d._open[-1], now)

    def _cutoff(self) -> float | None:
        """When the probe's window ends (None: not known yet, the users are still starting)."""
        if self.d.kind == "rate":
            st = self.d._open[-1]
            return st.end_unix if st.stage in self.d._ended else None
        return None if self.d.current is None else self.d.current.measure_end_unix

    def _settled(self, cutoff: float, now: float) -> bool:
        """Every request sent before ``cutoff`` is stored: each worker either numbered a request
        sent after it with none missing below, or has nothing in flight and all its rows
        stored (a worker without users at this level)."""
        run_id = self.d.collector.run_id
        try:
            done = self.d.collector.writer.reads.run(
                lambda cur: settled_workers(cur, run_id, cutoff))
        except Exception as exc:  # noqa: BLE001 - asked again next tick, within the limit
            log.warning("servelab: search: settle check failed (%s); retrying", exc)
            done = set()
        fresh = now >= cutoff + COUNTERS_FRESH_S
        waiting = [a.worker for a in self.d.collector.accounts.all() if a.worker not in done and
                   not (fresh and a.started == a.produced == a.stored)]
        if not waiting:
            return True
        if now - cutoff > self.settle_limit_s:
            log.warning("servelab: search: probe %d judged %.0f s after its window with worker(s)"
                        " %s still owing rows", len(self.probes), now - cutoff,
                        ", ".join(waiting))
            return True
        return False

    def _health_stored(self, now: float) -> bool:
        """Every worker's health samples stored up to the probe's end (the saturation verdict
        reads them), or HEALTH_WAIT_S passed (a worker that stopped sampling)."""
        run_id, until = self.d.collector.run_id, self.ended
        try:
            latest = self.d.collector.writer.reads.run(lambda cur: health_until(cur, run_id))
        except Exception as exc:  # noqa: BLE001 - asked again next tick, within the limit
            log.warning("servelab: search: health check failed (%s); retrying", exc)
            latest = {}
        if all(latest.get(a.worker, 0.0) >= until for a in self.d.collector.accounts.all()):
            return True
        if now - until > HEALTH_WAIT_S:
            log.warning("servelab: search: probe %d judged without every worker's health "
                        "samples up to its end", len(self.probes))
            return True
        return False

    def _judge(self) -> None:
        plan, position = self.probes[-1], self.positions[-1]
        run_id = self.d.collector.run_id
        probe = self.d.collector.writer.reads.run(lambda cur: read_probe(
            cur, run_id, plan.index, position, plan.level, self.target, self.max_error_rate))
        self.search.record(probe)
        a, iv = probe.attainment, probe.interval
        log.info("servelab: search probe %d (stage %d, %g %s): %s of %d requests met the SLOs"
                 "%s: %s", len(self.probes), plan.index, plan.level, self.unit,
                 "-" if a is None else f"{a:.1%}", probe.requests,
                 f" (95% interval {iv[0]:.1%}-{iv[1]:.1%})" if iv else "", probe.label())
