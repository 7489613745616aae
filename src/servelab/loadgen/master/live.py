"""The master's live window: the figures of the last ten seconds, and a time series of them since
the run began (one point per ``step_s``, memory bounded), for the web UI's LLM tab, the JSON API,
the status file and the progress line. The stored rows, not these, are the run's result.

The request figures, and the engine queue and prefill times of the server's own spans, are the
views' own SQL over the rows the run has stored so far
(``servelab_live_figures`` in analysis/30_stage_summary.sql, on request_metrics and the ITL
sketches; ``live_figures.StoredFigures``), run in the writer's database thread and only when
someone asks: the LLM tab's view at most every ``VIEW_REFRESH_S``, the status file's headline
every ``STATUS_REFRESH_S``.

Generator health comes from the last health row of each batch, judged as ``store/runs.py``
judges a stage (median loop-lag p99 and CPU over its limits), over the last ten seconds, so the
UI shows a saturation within a second of its start; the server's state comes from the master's
``/metrics`` scrape (``scraper.server_state``).
"""
from __future__ import annotations

import logging
import time
from collections import deque

import duckdb
import gevent
import orjson

from servelab.loadgen.messages import StageMessage
from servelab.core.quantiles import quantile_cont
from servelab.loadgen.master.live_figures import StoredFigures
from servelab.loadgen.master.scraper import server_figures
from servelab.store.runs import CPU_LIMIT, HEALTH_COLUMNS, LOOP_LAG_LIMIT_MS, judge_medians

LIVE_WINDOW_S = 10.0
STEP_S = 2.0
# A statement costs the database thread 12-28 ms, two thirds of it DuckDB planning it: the LLM
# tab (polling every 1.5 s) gets a new one every other poll, or at its next poll a second after
# a series point fell due (its charts move one point per step), the status file and the
# progress line one per window (bench/live_window_cost.py)
VIEW_REFRESH_S = 2.9
VIEW_DUE_REFRESH_S = 1.0
STATUS_REFRESH_S = LIVE_WINDOW_S
log = logging.getLogger("servelab.loadgen")
BATCHES_KEPT = 1000         # batch numbers remembered per worker (a resend comes after 5 s)
MAX_POINTS = 1800           # then every other point goes and the step doubles
MIN_HEALTH_SAMPLES = 3      # one slow second (a spawn burst) is no verdict
SERIES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms",
          "output_tokens_per_s", "requests_per_s", "errors_per_s", "goodput", "slo_attainment")
HEADLINE = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms",
            "output_tokens_per_s", "requests_per_s", "goodput", "slo_attainment")
SERVER_SERIES = ("running", "waiting", "kv_cache_usage", "preemptions_per_s",
                 "prefix_cache_hit_rate", "spec_acceptance_rate", "spec_mean_acceptance_length")
GENERATOR_SERIES = ("users", "in_flight", "cpu_percent_max", "loop_lag_p99_ms_max")
SPAN_SERIES = ("span_queue_p50_ms", "span_prefill_p50_ms")


def for_run(collector, profile) -> "LiveWindow":
    """A run's window, on the collector's writer (its stored rows), users and current stage."""
    window = LiveWindow(source=collector.writer)
    window.users = lambda: getattr(collector.runner, "user_count", None)
    window.stage = lambda: collector.stages.current
    return window


def view_of(collector, since: float | None = None) -> dict:
    """``Collector.live_view``: the window's view with the run's state, stages and scrape."""
    stages = [{k: v for k, v in st.to_message().items() if k != "version"}
              for _, st in sorted(collector.stages.by_index.items())]
    if collector.active:
        state = "draining" if collector.draining else "running"
    else:
        state = "finished" if collector.run_id else "idle"
    view = collector.live.view(stages, since, run_id=collector.run_id, state=state,
                               stage=_stage_no(collector.stages.current),
                               plan_stages=len(collector.plan_stages))
    if collector.scraper is not None:
        view["server"]["scrape"] = collector.scraper.status
    # what each endpoint servelab reads answered (the server panel's table)
    view["server"]["endpoints"] = collector.endpoints.view()
    return view


class LiveWindow:
    """``source``: the run's stored rows (its ``DbWriter``: ``live_figures.StoredFigures``);
    None: no request figures."""

    def __init__(self, source=None, window_s: float = LIVE_WINDOW_S, step_s: float = STEP_S,
                 clock=time.time, max_points: int = MAX_POINTS):
        self.window_s = window_s
        self.step_s = step_s
        self.clock = clock
        self.max_points = max_points
        self.started_unix = clock()
        self.requests = StoredFigures(source, window_s, clock, self.started_unix)
        self._batches: dict[str, set] = {}       # worker -> batch numbers seen
        self._next_point = self.started_unix + step_s
        self.series: dict[str, list] = {k: [] for k in ("t_unix", *SERIES, *SERVER_SERIES,
                                                        *GENERATOR_SERIES, *SPAN_SERIES)}
        self.class_series: dict[str, dict[str, list]] = {}
        self.health: dict[str, deque] = {}       # worker -> (t, row) of the last window
        self.trips: list[dict] = []              # each worker's first saturation per stage
        self._tripped: set = set()
        self._rule_db = None                     # in-memory DuckDB: the saturation rule's SQL
        self._health_changed = False
        self._verdicts: dict[str, dict] = {}     # worker -> its verdict at the last judgement
        self.scrapes: deque = deque()            # (t, server_state) of the last window
        self.scrape_status: str | None = None
        self.users = None                        # callables set by the collector
        self.stage = None
        self._ticks = None

    def start_ticks(self) -> None:
        # The series gets its points on time even when no rows come (a stalled server).
        def loop():
            while True:
                gevent.sleep(1.0)
                self._judge()
                self.tick()

        self._ticks = gevent.spawn(loop)

    def stop_ticks(self) -> None:
        if self._ticks is not None:
            self._ticks.kill(block=False)

    # ---- input ----------------------------------------------------------------------------
    def add_batch(self, data: dict) -> None:
        """A worker's batch: its newest health row, once (a resend is a copy). Its requests
        count once the writer has stored them."""
        seen = self._batches.setdefault(data["worker"], set())
        if data["batch"] in seen:
            return
        seen.add(data["batch"])
        if len(seen) > 2 * BATCHES_KEPT:
            newest = max(seen)
            seen.difference_update([b for b in seen if b < newest - BATCHES_KEPT])
        health = data.get("health")
        if health:
            try:
                self.add_health(data["worker"],
                                orjson.loads(health.rstrip(b"\n").rsplit(b"\n", 1)[-1]))
            except (ValueError, TypeError) as exc:
                log.warning("servelab: a health row the live view cannot read: %s", exc)

    def add_health(self, worker: str, row: dict, t: float | None = None) -> None:
        """A worker's newest ``client_health`` row (a dict)."""
        t = self.clock() if t is None else t
        q = self.health.setdefault(worker, deque())
        q.append((t, row))
        while q and t - q[0][0] > self.window_s:
            q.popleft()
        self._health_changed = True

    def add_scrape(self, t: float, state: dict, status: str = "ok") -> None:
        self.scrape_status = status
        self.scrapes.append((t, state))
        while self.scrapes and t - self.scrapes[0][0] > self.window_s + self.step_s:
            self.scrapes.popleft()

    def _stage_no(self):
        return _stage_no(self.stage() if self.stage is not None else None)

    # ---- health ---------------------------------------------------------------------------
    def _judge(self) -> None:
        """store/runs.py's rule (its SQL) on each worker's last window: the medians of loop-lag
        p99 and CPU, and the cause; and each worker's first saturation per stage. Once a second
        (the ticker) and per view, not per health row or series point: a DuckDB query costs a
        millisecond or more, in the event loop the batches come in on."""
        if not self._health_changed:
            return
        self._health_changed = False
        workers = sorted(self.health)
        rows = [[r for _, r in self.health[w]] for w in workers]
        medians = [{c: _median([r[c] for r in rs if r.get(c) is not None])
                    for c in HEALTH_COLUMNS} for rs in rows]
        if self._rule_db is None:   # one thread: eight rows need no pool, and none to wake
            self._rule_db = duckdb.connect(config={"threads": 1})
        judged = judge_medians(self._rule_db, medians)
        self._verdicts = {w: _verdict(rs, m, saturated, cause)
                          for w, rs, m, (saturated, cause) in zip(workers, rows, medians, judged)}
        stage = self._stage_no()
        for w, v in self._verdicts.items():
            if v["saturated"] and (w, stage) not in self._tripped:
                self._tripped.add((w, stage))
                self.trips.append({"worker": w, "t_unix": self.health[w][-1][0], "stage": stage,
                                   "cause": v["cause"],
                                   "loop_lag_p99_ms": v["loop_lag_p99_ms"],
                                   "cpu_percent": v["cpu_percent"]})

    def in_flight(self) -> int | None:
        latest = [q[-1][1].get("in_flight") for q in self.health.values() if q]
        latest = [x for x in latest if x is not None]
        return sum(latest) if latest else None

    # ---- the request figures: the views' SQL over the stored rows -------------------------
    @property
    def errors(self) -> int:
        """Over the whole run (the status file's count)."""
        return self.requests.errors

    def _fill(self, computed: dict) -> None:
        """Series points get their request figures (``StoredFigures.refresh``)."""
        index = {t: i for i, t in enumerate(self.series["t_unix"])}
        for t, fig in computed.items():
            i = index.get(t)
            if i is None:      # thinned out while it waited
                continue
            for key in SERIES:
                self.series[key][i] = fig[key]
            self.series["span_queue_p50_ms"][i] = fig["spans"]["queue_p50_ms"]
            self.series["span_prefill_p50_ms"][i] = fig["spans"]["prefill_p50_ms"]
            for cls in set(self.class_series) | set(fig["classes"]):
                cs = self.class_series.setdefault(cls, {k: [None] * len(index)
                                                        for k in ("goodput", "slo_attainment")})
                c = fig["classes"].get(cls, {})
                cs["goodput"][i] = c.get("goodput", 0.0)
                cs["slo_attainment"][i] = c.get("slo_attainment")

    def finish(self) -> None:
        """The run's last points and figures, while its database is open; no statement after."""
        self.tick()
        self.figures()
        self.requests.source = None

    def figures(self, max_age_s: float = 0.0) -> dict:
        """The last window's request figures (a JSON-able dict, None where nothing counted),
        from a statement at most ``max_age_s`` old."""
        self._fill(self.requests.refresh(max_age_s))
        return self.requests.now

    def headline(self) -> dict:
        """The status file's and the progress line's few figures of the last window."""
        fig = self.figures(STATUS_REFRESH_S)
        return {k: fig[k] for k in HEADLINE} | {"in_flight": self.in_flight()}

    # ---- output ---------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Append the series points that are due (the collector calls it every second)."""
        now = self.clock() if now is None else now
        while self._next_point <= now:
            self._point(self._next_point)
            self._next_point += self.step_s

    def _point(self, t: float) -> None:
        """A point's server, span and generator figures now; its request figures (the rows
        stored during its step) at the next statement."""
        self.requests.point_due(t, self.step_s)
        s = self.series
        s["t_unix"].append(t)
        for key in SERIES:
            s[key].append(None)
        for cs in self.class_series.values():
            for key in cs:
                cs[key].append(None)
        server = server_figures([x for x in self.scrapes if x[0] <= t and
                                 x[0] > t - self.step_s - 1.0])
        for key in SERVER_SERIES:
            s[key].append(server.get(key))
        for key in SPAN_SERIES:
            s[key].append(None)
        verdicts = list(self._verdicts.values())
        s["users"].append(self.users() if self.users is not None else None)
        s["in_flight"].append(self.in_flight())
        s["cpu_percent_max"].append(_max(v["cpu_percent"] for v in verdicts))
        s["loop_lag_p99_ms_max"].append(_max(v["loop_lag_p99_ms"] for v in verdicts))
        if len(s["t_unix"]) > self.max_points:
            for series in (s, *self.class_series.values()):
                for key in series:
                    series[key] = series[key][1::2]
            self.requests.keep(set(s["t_unix"]))
            self.step_s *= 2

    def view(self, stages: list[dict], since: float | None = None, **extra) -> dict:
        """Everything the LLM tab draws, as JSON (None, never NaN). ``since``: only the series
        points after that time (a poller's increment), and only those with their figures."""
        now = self.clock()
        self._judge()
        self.tick(now)
        fig = dict(self.figures(VIEW_DUE_REFRESH_S if self.requests.due else VIEW_REFRESH_S))
        t = self.series["t_unix"]
        done = len(t) - self.requests.due
        first = 0 if since is None else next((i for i, x in enumerate(t) if x > since), len(t))
        workers = dict(self._verdicts)
        server = server_figures(list(self.scrapes))
        fig["users"] = self.users() if self.users is not None else None
        fig["in_flight"] = self.in_flight()
        spans = fig.pop("spans")
        return {
            **extra,
            "t_unix": now, "started_unix": self.started_unix, "window_s": self.window_s,
            "step_s": self.step_s, "now": fig,
            "errors_total": self.errors,
            "errors_by_kind_total": dict(self.requests.errors_by_kind),
            "server": dict(server, scrape=self.scrape_status),
            "spans": dict(spans, total=self.requests.spans_total),
            "generator": {"workers": workers,
                          "saturated": any(v["saturated"] for v in workers.values()),
                          "trips": list(self.trips),
                          "limits": {"loop_lag_p99_ms": LOOP_LAG_LIMIT_MS,
                                     "cpu_percent": CPU_LIMIT}},
            "stages": stages,
            "series": {k: v[first:done] for k, v in self.series.items()},
            "class_series": {c: {k: v[first:done] for k, v in s.items()}
                             for c, s in sorted(self.class_series.items())},
        }


def _median(values: list) -> float | None:
    m = quantile_cont(values, 0.5)
    return None if m != m else m   # None, not NaN: the view is JSON


def _verdict(rows: list[dict], medians: dict, saturated: bool, cause: str) -> dict:
    latest = rows[-1] if rows else {}
    saturated = len(rows) >= MIN_HEALTH_SAMPLES and saturated
    return {"cpu_percent": latest.get("cpu_percent"),
            "loop_lag_p99_ms": latest.get("loop_lag_p99_ms"),
            "loop_lag_p99_ms_median": medians["loop_lag_p99_ms"],
            "cpu_percent_median": medians["cpu_percent"],
            "in_flight": latest.get("in_flight"), "backlog": latest.get("backlog"),
            "host_cpu_percent": latest.get("host_cpu_percent"),
            "rss_mb": latest.get("rss_mb"), "samples": len(rows),
            "saturated": saturated, "cause": cause if saturated else None}


def _stage_no(st: StageMessage | None) -> int | None:
    return None if st is None else st.stage


def _max(values):
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None
