"""The live window's request figures: ``servelab_live_figures`` (analysis/30_stage_summary.sql, the
views' definitions) over spans of a run's stored rows, and its rows as the view's figures.

A request counts once the writer has stored it (its batch's write, a second or so after it
ended): the writer notes how far the `requests` table reached at each write (``DbWriter.marks``),
and a series point's requests are the rows stored during its step, the window's those stored in
its last ten seconds, so no clock has to agree between hosts. A statement costs the database
thread 12-28 ms, two thirds of it planning, whatever it covers, so the window and every point
due since the last one go in one, and only when asked (bench/live_window_cost.py).
"""
from __future__ import annotations

import bisect
import logging

log = logging.getLogger("servelab.loadgen")
WINDOW, NEW = -1, -2   # a statement's points that are not series points
SQL = "SELECT * FROM servelab_live_figures(?, ?, ?, ?, ?)"


def query(con, run_id: str, spans: list[dict], firsts: tuple) -> list[dict]:
    """The statement's rows as dicts (``spans``: [{point, lo, hi, span_lo, span_hi}] rowid spans
    of `requests` and `server_spans`; ``firsts``: the first rowids of `requests`,
    `itl_sketches` and `server_spans` read)."""
    cur = con.execute(SQL, [run_id, spans, *firsts])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


class StoredFigures:
    """``source``: ``marks`` ((t_unix, requests end, itl_sketches end, server_spans end) after
    each write) and ``live_figures(spans, firsts)`` (the statement), the run's ``DbWriter``."""

    def __init__(self, source, window_s: float, clock, started_unix: float):
        self.source = source
        self.window_s = window_s
        self.clock = clock
        self.started_unix = started_unix
        self.errors = 0                          # over the whole run
        self.errors_by_kind: dict[str, int] = {}
        self.spans_total = 0
        self._pending: dict[float, tuple] = {}   # point t -> (rows' span, its step): to compute
        self._counted = self._ends_at(started_unix)   # rows counted in the errors so far
        self._last_end = self._counted           # where the last point's rows ended
        self.now = figures_of([], window_s)      # the window's, at the last statement
        self._refreshed = -float("inf")

    @property
    def due(self) -> int:
        return len(self._pending)

    def _ends_at(self, t: float) -> tuple[int, int, int]:
        """How far `requests`, `itl_sketches` and `server_spans` reached at the last write at or
        before t (at the first write known, when none was)."""
        marks = list(self.source.marks) if self.source is not None else []   # one C-level copy
        i = max(bisect.bisect_right([m[0] for m in marks], t) - 1, 0)
        return tuple(marks[i][1:]) if marks else (0, 0, 0)

    def point_due(self, t: float, step_s: float) -> None:
        """A series point at t: the rows stored since the last one."""
        end = self._ends_at(t)
        self._pending[t] = (self._last_end, end, step_s)
        self._last_end = end

    def keep(self, points: set) -> None:
        """Only these points are still in the series (it was thinned)."""
        self._pending = {t: p for t, p in self._pending.items() if t in points}

    def refresh(self, max_age_s: float = 0.0) -> dict:
        """The window's figures and those of every point due (t -> figures, returned), in one
        statement, unless the last one is younger than ``max_age_s``."""
        now = self.clock()
        if self.source is None:
            done, self._pending = self._pending, {}
            return {t: figures_of([], p[2]) for t, p in done.items()}
        if now - self._refreshed < max_age_s:
            return {}
        self._refreshed = now
        end = self._ends_at(now)
        # The statement waits on the database thread: a point that falls due meanwhile (the
        # ticker) waits for the next statement.
        asked = dict(self._pending)
        spans = {WINDOW: (self._ends_at(now - self.window_s), end), NEW: (self._counted, end),
                 **{t: p[:2] for t, p in asked.items()}}
        keys = {WINDOW: WINDOW, NEW: NEW, **{t: i for i, t in enumerate(asked)}}
        try:
            rows = self.source.live_figures(
                [{"point": keys[k], "lo": lo[0], "hi": hi[0], "span_lo": lo[2], "span_hi": hi[2]}
                 for k, (lo, hi) in spans.items()],
                tuple(min(lo[i] for lo, _ in spans.values()) for i in range(3)))
        except Exception as exc:  # noqa: BLE001 - a closed or failing database: figures kept
            log.warning("servelab: the live window's figures failed (%s: %s)",
                        type(exc).__name__, exc)
            return {}
        by_point: dict[int, list] = {}
        for row in rows:
            by_point.setdefault(row["point"], []).append(row)
        self.now = figures_of(by_point.get(WINDOW, []),
                              max(min(self.window_s, now - self.started_unix), 1e-9))
        self._counted = end
        new = figures_of(by_point.get(NEW, []), 1.0)
        self.spans_total += new["spans"]["spans"]
        for kind, n in new["errors_by_kind"].items():
            self.errors += n
            self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + n
        for t in asked:
            self._pending.pop(t, None)
        return {t: figures_of(by_point.get(keys[t], []), p[2]) for t, p in asked.items()}


def figures_of(rows: list[dict], span_s: float) -> dict:
    """servelab_live_figures' rows of one point as the view's figures, rates over ``span_s``."""
    total = next((r for r in rows if r["class_name"] == "(all)"), {})
    per_s = 1.0 / span_s if span_s > 0 else None

    def rate(x):
        return None if per_s is None or x is None else x * per_s

    requests, met = total.get("requests", 0), total.get("slo_met_requests", 0)
    fig = {k: total.get(k) for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
                                     "tpot_p50_ms", "e2e_p50_ms")}
    fig.update({
        "requests": requests, "completed": total.get("completed", 0),
        "errors": total.get("errors", 0), "errors_by_kind": dict(total.get("errors_by_kind") or {}),
        "dropped": total.get("dropped", 0),
        "output_tokens_per_s": rate(float(total.get("output_tokens") or 0)),
        "requests_per_s": rate(requests), "errors_per_s": rate(total.get("errors", 0)),
        "goodput": rate(met), "slo_attainment": met / requests if requests else None,
        "spans": {k: total.get(k) for k in ("queue_p50_ms", "queue_p99_ms", "prefill_p50_ms",
                                            "prefill_p99_ms")} | {"spans": total.get("spans", 0)},
        "classes": {r["class_name"]: {"requests": r["requests"],
                                      "slo_met_requests": r["slo_met_requests"],
                                      "goodput": rate(r["slo_met_requests"]),
                                      "slo_attainment": (r["slo_met_requests"] / r["requests"]
                                                         if r["requests"] else None)}
                    for r in sorted(rows, key=lambda r: r["class_name"])
                    if r["class_name"] != "(all)"},
    })
    return fig
