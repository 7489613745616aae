"""The master's live window: the figures of the last ten seconds, and a time series of them since
the run began (one point per ``step_s``, memory bounded), for the web UI's LLM tab, the JSON API,
the status file and the progress line. The stored rows, not these, are the run's result; the
arithmetic and its definitions are ``live_stats``'s (the SQL views' own).

Requests count when their batch reaches the master (a worker ships every 0.25 s), so the window
needs no clock agreement between hosts. Generator health comes from the last health row of each
batch, judged as ``store/runs.py`` judges a stage (median loop-lag p99 and CPU over its limits),
over the last ten seconds, so the UI shows a saturation within a second of its start; the server's
state comes from the master's ``/metrics`` scrape (``scraper.server_state``), and the engine
queue and prefill times from the server's own spans as the master's receiver gets them
(``spans_intake``; a span comes when its request ends, in the exporter's next batch).
"""
from __future__ import annotations

import logging
import time
from collections import deque

import duckdb
import gevent
import orjson

from servelab.loadgen.messages import StageMessage
from servelab.loadgen.master.live_stats import Bucket, add_samples, figures, quantile
from servelab.loadgen.master.scraper import server_figures
from servelab.store.runs import CPU_LIMIT, HEALTH_COLUMNS, LOOP_LAG_LIMIT_MS, judge_medians

LIVE_WINDOW_S = 10.0
STEP_S = 2.0
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
    """A run's window: its classes' SLOs, and the collector's users and current stage."""
    window = LiveWindow({c.name: (c.slo.ttft_ms, c.slo.tpot_ms, c.slo.itl_ms, c.slo.e2e_ms)
                         for c in profile.classes})
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
    """``slos``: class -> (ttft, tpot, itl, e2e) ms, None where the class sets none."""

    def __init__(self, slos: dict | None = None, window_s: float = LIVE_WINDOW_S,
                 step_s: float = STEP_S, clock=time.time, max_points: int = MAX_POINTS):
        self.slos = slos or {}
        self.window_s = window_s
        self.step_s = step_s
        self.clock = clock
        self.max_points = max_points
        self.started_unix = clock()
        self.errors = 0                 # over the whole run (the status file's count)
        self.errors_by_kind: dict[str, int] = {}
        self._buckets: dict[int, Bucket] = {}
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
        self.spans: deque = deque()              # (t, queue_ms, prefill_ms) of recent spans
        self.spans_total = 0
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
        """A worker's batch: its samples and its newest health row, once (a resend is a copy)."""
        seen = self._batches.setdefault(data["worker"], set())
        if data["batch"] in seen:
            return
        seen.add(data["batch"])
        if len(seen) > 2 * BATCHES_KEPT:
            newest = max(seen)
            seen.difference_update([b for b in seen if b < newest - BATCHES_KEPT])
        self.add(data.get("live"))
        health = data.get("health")
        if health:
            try:
                self.add_health(data["worker"],
                                orjson.loads(health.rstrip(b"\n").rsplit(b"\n", 1)[-1]))
            except (ValueError, TypeError) as exc:
                log.warning("servelab: a health row the live view cannot read: %s", exc)

    def add(self, samples, t: float | None = None) -> None:
        """One batch's per-request samples (see ``live_stats``)."""
        if not samples:
            return
        t = self.clock() if t is None else t
        self.tick(t)
        key = int(t)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket()
        add_samples(bucket, samples, self.slos)
        for s in samples:
            if s[1] is not None and s[7] != "dropped":
                self.errors += 1
                self.errors_by_kind[s[1]] = self.errors_by_kind.get(s[1], 0) + 1

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

    def add_spans(self, phases: list, t: float | None = None) -> None:
        """One export's (queue_ms, prefill_ms) per span joined to a request of this run."""
        t = self.clock() if t is None else t
        self.spans.extend((t, q, p) for q, p in phases)
        self.spans_total += len(phases)
        while self.spans and t - self.spans[0][0] > self.window_s + 2 * self.step_s:
            self.spans.popleft()

    def span_figures(self, lo: float, hi: float) -> dict:
        """Medians and p99s of the spans received in (lo, hi]: live_stats' quantile."""
        got = [(q, p) for t, q, p in self.spans if lo < t <= hi]
        queue = [q for q, _ in got if q is not None]
        prefill = [p for _, p in got if p is not None]
        return {"spans": len(got),
                "queue_p50_ms": quantile(queue, 0.5), "queue_p99_ms": quantile(queue, 0.99),
                "prefill_p50_ms": quantile(prefill, 0.5),
                "prefill_p99_ms": quantile(prefill, 0.99)}

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
        medians = [{c: quantile([r[c] for r in rs if r.get(c) is not None], 0.5)
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

    # ---- output ---------------------------------------------------------------------------
    def _window(self, now: float, span: float) -> tuple[list[Bucket], float]:
        lo = now - span
        chosen = [b for k, b in self._buckets.items() if k + 1 > lo and k < now]
        return chosen, max(min(span, now - self.started_unix), 1e-9)

    def figures(self, now: float | None = None) -> dict:
        """The last window's request figures (a JSON-able dict, None where nothing counted)."""
        now = self.clock() if now is None else now
        buckets, span = self._window(now, self.window_s)
        return figures(buckets, span)

    def headline(self) -> dict:
        """The status file's and the progress line's few figures of the last window."""
        fig = self.figures()
        return {k: fig[k] for k in HEADLINE} | {"in_flight": self.in_flight()}

    def tick(self, now: float | None = None) -> None:
        """Append the series points that are due (the collector calls it every second)."""
        now = self.clock() if now is None else now
        while self._next_point <= now:
            self._point(self._next_point)
            self._next_point += self.step_s
        horizon = now - self.window_s - 2 * self.step_s - 1
        for k in [k for k in self._buckets if k < horizon]:
            del self._buckets[k]

    def _point(self, t: float) -> None:
        buckets = [b for k, b in self._buckets.items() if t - self.step_s <= k < t]
        fig = figures(buckets, self.step_s)
        s = self.series
        s["t_unix"].append(t)
        for key in SERIES:
            s[key].append(fig[key])
        server = server_figures([x for x in self.scrapes if x[0] <= t and
                                 x[0] > t - self.step_s - 1.0])
        for key in SERVER_SERIES:
            s[key].append(server.get(key))
        spans = self.span_figures(t - self.step_s, t)
        s["span_queue_p50_ms"].append(spans["queue_p50_ms"])
        s["span_prefill_p50_ms"].append(spans["prefill_p50_ms"])
        verdicts = list(self._verdicts.values())
        s["users"].append(self.users() if self.users is not None else None)
        s["in_flight"].append(self.in_flight())
        s["cpu_percent_max"].append(_max(v["cpu_percent"] for v in verdicts))
        s["loop_lag_p99_ms_max"].append(_max(v["loop_lag_p99_ms"] for v in verdicts))
        n = len(s["t_unix"]) - 1
        for cls in set(self.class_series) | set(fig["classes"]):
            cs = self.class_series.setdefault(cls, {"goodput": [None] * n,
                                                    "slo_attainment": [None] * n})
            c = fig["classes"].get(cls, {})
            cs["goodput"].append(c.get("goodput", 0.0))
            cs["slo_attainment"].append(c.get("slo_attainment"))
        if len(s["t_unix"]) > self.max_points:
            for series in (s, *self.class_series.values()):
                for key in series:
                    series[key] = series[key][1::2]
            self.step_s *= 2

    def view(self, stages: list[dict], since: float | None = None, **extra) -> dict:
        """Everything the LLM tab draws, as JSON (None, never NaN). ``since``: only the series
        points after that time (a poller's increment)."""
        now = self.clock()
        self._judge()
        self.tick(now)
        t = self.series["t_unix"]
        first = 0 if since is None else next((i for i, x in enumerate(t) if x > since), len(t))
        workers = dict(self._verdicts)
        server = server_figures(list(self.scrapes))
        fig = self.figures(now)
        fig["users"] = self.users() if self.users is not None else None
        fig["in_flight"] = self.in_flight()
        return {
            **extra,
            "t_unix": now, "started_unix": self.started_unix, "window_s": self.window_s,
            "step_s": self.step_s, "now": fig,
            "errors_total": self.errors, "errors_by_kind_total": dict(self.errors_by_kind),
            "server": dict(server, scrape=self.scrape_status),
            "spans": dict(self.span_figures(now - self.window_s, now), total=self.spans_total),
            "generator": {"workers": workers,
                          "saturated": any(v["saturated"] for v in workers.values()),
                          "trips": list(self.trips),
                          "limits": {"loop_lag_p99_ms": LOOP_LAG_LIMIT_MS,
                                     "cpu_percent": CPU_LIMIT}},
            "stages": stages,
            "series": {k: v[first:] for k, v in self.series.items()},
            "class_series": {c: {k: v[first:] for k, v in s.items()}
                             for c, s in sorted(self.class_series.items())},
        }


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
