"""The live window's figures, computed by the SQL views' own definitions in an in-memory DuckDB.

A figure here and the stored stage's figure differ only in which requests they count (here:
those whose batch reached the master in the window, warm-up included, because the live view
shows what is happening now), never in how they are computed:

- per request: k_i = ``servelab_chunk_weight`` (analysis/10's macro), g_i = offset_i -
  offset_{i-1}, the worst per-token gap max g_i / k_i and the chunk token total as store.db's
  REQUEST_SCALARS define them; TPOT and slo_met are analysis/10's macros ``servelab_tpot_ms``
  and ``servelab_slo_met``, with which request_metrics computes its own columns; an ITL sample
  g_i / k_i (counted k_i times) goes into store.db's sketch bucket (``_bucket``, the writer's)
  and reads back as analysis/25's ``servelab_sketch_value``. The macros are read from the
  analysis files themselves (``shared_macros``), so an edit there changes both.
- over the window: quantile_cont for TTFT, TPOT, E2E (stage_summary's), and the ITL token view's
  percentiles read from the merged sketch as itl_stage_quantiles reads it (the order statistics
  at floor(h) and floor(h) + 1, h = (samples - 1) q, interpolated); output tokens =
  coalesce(usage, chunk tokens) of every request with chunks; goodput = slo_met requests / s,
  attainment = slo_met / requests (failures included); a dropped arrival is no request.

Cost: the event loop only turns a batch's samples into a few numpy columns (``batch_columns``),
less than its numpy arithmetic took before; the rest runs in DuckDB on a gevent ThreadPool of
one native thread at the writer's lower priority (``WindowStats``; DuckDB releases the GIL). Each batch is folded once into
per-request rows and per-second sketch bins, and a window's figures read those few rows; at 256
streams about 30 ms of CPU a second off the event loop, 2 ms on it (bench/live_window_cost.py).

A sample is what ``worker/recorder.py`` ships per request: (class_name, error_kind, ttft_ms,
e2e_ms, output_tokens, chunk_offsets_ms, chunk_tokens, arrival_status).
"""
from __future__ import annotations

import logging
import re

import duckdb
from gevent.threadpool import ThreadPool
import numpy as np
from gevent.lock import Semaphore

from servelab.core.paths import analysis_dir
from servelab.core.quantiles import quantiles_cont
from servelab.loadgen.master.writer import yield_core_to_the_loop
# the store's sketch bucket of a value, the one the writer files every gap under
from servelab.store.db import _bucket

log = logging.getLogger("servelab.loadgen")
QS = (0.5, 0.99)
MACROS = ("servelab_chunk_weight", "servelab_tpot_ms", "servelab_slo_met",
          "servelab_sketch_value")
_MACRO = re.compile(r"^CREATE OR REPLACE MACRO (\w+)\(.*?;$", re.MULTILINE | re.DOTALL)

_TABLES = """
CREATE TABLE live_names (code BIGINT, name VARCHAR);
CREATE TABLE live_classes (name VARCHAR, slo_ttft_ms DOUBLE, slo_tpot_ms DOUBLE,
                           slo_itl_ms DOUBLE, slo_e2e_ms DOUBLE);
CREATE TABLE live_requests (sec BIGINT, cls VARCHAR, error_kind VARCHAR, dropped BOOLEAN,
                            ok BOOLEAN, ttft_ms DOUBLE, e2e_ms DOUBLE, tpot_ms DOUBLE,
                            usage_tokens DOUBLE, slo_met BOOLEAN);
CREATE TABLE live_itl (sec BIGINT, bin INTEGER, n BIGINT);
"""
# A batch's chunks, one row each in request order (``prev`` the row before's offset, ``pos`` 0
# on a request's first chunk): k_i = servelab_chunk_weight(chunk_tokens[i]) and, from the second
# chunk on, g_i = offset_i - offset_{i-1}, as store.db's REQUEST_SCALARS and ITL sketches take
# them from a row's lists. Hash aggregates over flat rows: rebuilding each request's lists to run
# the writer's list expressions cost 4x more (a sort per batch).
_GAPS = """SELECT req, servelab_chunk_weight(CAST(tok AS INTEGER)) AS k,
       CASE WHEN pos > 0 THEN off - prev END AS g
FROM live_chunks_in"""
# Two statements a fold (each costs a millisecond or two however few its rows): the batch's
# requests with their names, and its sketch bins.
_FOLD = f"""
INSERT INTO live_requests
WITH gaps AS ({_GAPS})
SELECT r.sec, n.name, e.name, r.dropped, r.err < 0, r.ttft_ms, r.e2e_ms,
       servelab_tpot_ms(r.e2e_ms, r.ttft_ms, r.output_tokens),
       CASE WHEN p.chunk_count > 0 THEN coalesce(r.output_tokens, p.chunk_token_sum) END,
       servelab_slo_met(r.err < 0, r.ttft_ms, r.e2e_ms, r.output_tokens,
                        p.gap_token_max_ms, c.slo_ttft_ms, c.slo_tpot_ms, c.slo_itl_ms,
                        c.slo_e2e_ms)
FROM live_requests_in r
JOIN live_names n ON n.code = r.cls
LEFT JOIN live_names e ON e.code = r.err
LEFT JOIN (SELECT req, count(*) AS chunk_count, CAST(sum(k) AS DOUBLE) AS chunk_token_sum,
                  max(g / k) AS gap_token_max_ms           -- the worst per-token gap
           FROM gaps GROUP BY req) p ON p.req = r.req
LEFT JOIN live_classes c ON c.name = n.name;
-- the token view's sketch: g_i / k_i counted k_i times, over completed requests
INSERT INTO live_itl
WITH gaps AS ({_GAPS})
SELECT r.sec, b.bin, sum(b.k) FROM (
    SELECT req, k, {_bucket("g / k")} AS bin FROM gaps WHERE g IS NOT NULL
) b JOIN live_requests_in r ON r.req = b.req
WHERE r.err < 0 AND NOT r.dropped AND b.bin IS NOT NULL
GROUP BY r.sec, b.bin;
"""
# The window's figures in one statement: stage_summary's aggregates over the window's requests,
# and itl_stage_quantiles' reading of the merged sketch (the order statistics at floor(h) and
# floor(h) + 1, h = (samples - 1) q, each read from its bucket, interpolated).
_FIGURES = """
WITH r AS (SELECT * FROM live_requests WHERE sec >= $lo AND sec < $hi),
totals AS (
    SELECT count(*) AS requests, count(*) FILTER (WHERE ok) AS completed,
           count(*) FILTER (WHERE NOT ok) AS errors,
           histogram(error_kind) FILTER (WHERE NOT ok) AS errors_by_kind,
           quantile_cont(ttft_ms, [0.5, 0.99]) FILTER (WHERE ok) AS ttft_q,
           quantile_cont(tpot_ms, 0.5) FILTER (WHERE ok) AS tpot_p50,
           quantile_cont(e2e_ms, 0.5) FILTER (WHERE ok) AS e2e_p50,
           coalesce(sum(usage_tokens), 0) AS tokens, count(*) FILTER (WHERE slo_met) AS slo_met
    FROM r WHERE NOT dropped
),
classes AS (
    SELECT list({'cls': cls, 'n': n, 'met': met} ORDER BY cls) FILTER (WHERE n > 0) AS classes,
           coalesce(sum(dropped), 0) AS dropped
    FROM (SELECT cls, count(*) FILTER (WHERE NOT dropped) AS n,
                 count(*) FILTER (WHERE slo_met) AS met, count(*) FILTER (WHERE dropped) AS dropped
          FROM r GROUP BY cls)
),
bins AS (
    SELECT bin, sum(n) AS n FROM live_itl WHERE sec >= $lo AND sec < $hi GROUP BY bin
),
cumulative AS (
    SELECT *, sum(n) OVER (ORDER BY bin ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - n
              AS before, sum(n) OVER () AS total
    FROM bins
),
positions AS (
    SELECT q.q, (w.total - 1) * q.q AS h,
           unnest([floor((w.total - 1) * q.q),
                   least(floor((w.total - 1) * q.q) + 1, w.total - 1)]) AS pos
    FROM (SELECT DISTINCT total FROM cumulative) w
    CROSS JOIN (SELECT unnest([0.5, 0.99]::DOUBLE[]) AS q) q
),
located AS (
    SELECT p.q, p.h, p.pos, servelab_sketch_value(c.bin) AS value
    FROM positions p JOIN cumulative c ON p.pos >= c.before AND p.pos < c.before + c.n
),
itl AS (
    SELECT max(value) FILTER (WHERE q = 0.5) AS itl_p50,
           max(value) FILTER (WHERE q = 0.99) AS itl_p99
    FROM (SELECT q, arg_min(value, pos) + (arg_max(value, pos) - arg_min(value, pos))
                    * (any_value(h) - min(pos)) AS value
          FROM located GROUP BY q)
)
SELECT * FROM totals, classes, itl
"""


def shared_macros(names=MACROS, folder=None) -> list[str]:
    """The ``CREATE OR REPLACE MACRO`` statements of ``names`` from analysis/*.sql, in file
    order (a macro may call an earlier one)."""
    found: dict[str, str] = {}
    for path in sorted((folder or analysis_dir()).glob("[0-9]*_*.sql")):
        for m in _MACRO.finditer(path.read_text(encoding="utf-8")):
            if m.group(1) in names:
                found[m.group(1)] = m.group(0)
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"analysis/*.sql defines no macro {', '.join(missing)}")
    return [found[n] for n in names]


def batch_columns(samples: list, sec: int, first: int, code) -> tuple[dict, dict]:
    """One batch's samples as the numpy columns LiveDb folds: the event loop's whole share, a
    few passes over the batch's lists (chunk offsets joined once and converted once). Class
    names and error kinds go as ``code(name)``'s numbers (-1: none): DuckDB reads a column of
    Python strings 20x slower than a batch's numbers."""
    n = len(samples)
    lens = [len(s[5]) if s[5] else 0 for s in samples]
    offsets: list = []
    for s, k in zip(samples, lens):
        if k:
            offsets += s[5]
    counts = np.asarray(lens, dtype=np.int64)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if n else 0
    tok = np.ones(total)
    for s, k, end in zip(samples, lens, ends.tolist()):
        t = s[6]
        # the usual case, one token per chunk, costs a C-level count and no conversion; a chunk
        # past its counts has none (NaN: NULL in DuckDB, weight 1 as chunk_tokens[i] past the end)
        if k and not (t and len(t) == k and t.count(1) == k):
            t = list(t or ())[:k]
            tok[end - k:end] = np.array(t + [None] * (k - len(t)), dtype=np.float64)
    off = np.array(offsets, dtype=np.float64)
    ids = np.arange(first, first + n)
    requests = {
        "sec": np.full(n, sec, dtype=np.int64), "req": ids,
        "cls": np.array([code(s[0] or "(none)") for s in samples], dtype=np.int64),
        "err": np.array([-1 if s[1] is None else code(s[1]) for s in samples], dtype=np.int64),
        "ttft_ms": np.array([s[2] for s in samples], dtype=np.float64),
        "e2e_ms": np.array([s[3] for s in samples], dtype=np.float64),
        "output_tokens": np.array([s[4] for s in samples], dtype=np.float64),
        "dropped": np.array([s[7] == "dropped" for s in samples], dtype=bool)}
    starts = np.repeat(ends - counts, counts)
    # prev: the row before's offset (a shift, so that SQL takes each gap without a sort)
    chunks = {"req": np.repeat(ids, counts), "pos": np.arange(total) - starts, "off": off,
              "prev": np.concatenate(([np.nan], off[:-1])) if total else off, "tok": tok}
    return requests, chunks


def _concat(parts: list[dict]) -> dict:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


EMPTY = (0, 0, 0, None, None, None, None, 0, 0, None, 0, None, None)   # _FIGURES' row, no requests


class LiveDb:
    """The window's rows in an in-memory DuckDB; one caller at a time, on any one thread."""

    def __init__(self, slos: dict, folder=None):
        self.con = duckdb.connect(config={"threads": 1})
        for sql in shared_macros(folder=folder):
            self.con.execute(sql)
        self.con.execute(_TABLES)
        if slos:
            self.con.executemany("INSERT INTO live_classes VALUES (?, ?, ?, ?, ?)",
                                 [[c, *s] for c, s in slos.items()])

    def fold(self, batches: list[tuple[dict, dict]], names: list[tuple[int, str]] = ()) -> None:
        """Batches (``batch_columns``) into per-request rows and per-second sketch bins;
        ``names``: the codes first used since the last fold."""
        con = self.con
        if names:
            con.executemany("INSERT INTO live_names VALUES (?, ?)", [list(n) for n in names])
        if not batches:
            return
        con.register("live_requests_in", _concat([b[0] for b in batches]))
        con.register("live_chunks_in", _concat([b[1] for b in batches]))
        con.execute(_FOLD)
        con.unregister("live_requests_in")
        con.unregister("live_chunks_in")

    def forget(self, before: int) -> None:
        self.con.execute("DELETE FROM live_requests WHERE sec < ?", [before])
        self.con.execute("DELETE FROM live_itl WHERE sec < ?", [before])

    def figures(self, lo: int, hi: int, span_s: float) -> dict:
        """The figures of the requests that arrived in seconds [lo, hi), rates over span_s."""
        # No row at all when the window holds nothing the statement groups: the empty figures
        row = self.con.execute(_FIGURES, {"lo": lo, "hi": hi}).fetchone()
        return _shape(row if row is not None else EMPTY, span_s)


def _shape(row, span_s: float) -> dict:
    """The statement's row as the view's JSON (None, not NaN or a missing key)."""
    (requests, completed, errors, by_kind, ttft, tpot, e2e, tokens, slo_met, classes, dropped,
     itl_p50, itl_p99) = row
    per_s = 1.0 / span_s if span_s > 0 else None

    def rate(x):
        return None if per_s is None else x * per_s

    ttft = ttft or [None, None]
    return {
        "requests": requests, "completed": completed, "errors": errors,
        "errors_by_kind": dict(by_kind or {}), "dropped": int(dropped),
        "ttft_p50_ms": ttft[0], "ttft_p99_ms": ttft[1], "itl_p50_ms": itl_p50,
        "itl_p99_ms": itl_p99, "tpot_p50_ms": tpot, "e2e_p50_ms": e2e,
        "output_tokens_per_s": rate(float(tokens)), "requests_per_s": rate(requests),
        "errors_per_s": rate(errors), "goodput": rate(slo_met),
        "slo_attainment": slo_met / requests if requests else None,
        "classes": {c["cls"]: {"requests": c["n"], "slo_met_requests": c["met"],
                               "goodput": rate(c["met"]), "slo_attainment": c["met"] / c["n"]}
                    for c in classes or ()},
    }


class WindowStats:
    """The live window's requests and its figures: a batch is turned into columns on arrival
    (the event loop), folded and queried in DuckDB on a pool of one native thread (so the
    streams' greenlets run meanwhile). One query at a time; a query folds every batch that
    came before it."""

    EMPTY = EMPTY

    def __init__(self, slos: dict):
        self.slos = slos
        self._db: LiveDb | None = None
        self._broken: str | bool = False   # why the database could not be set up
        self._pending: list[tuple[dict, dict]] = []
        self._codes: dict[str, int] = {}           # class names and error kinds, numbered
        self._new_names: list[tuple[int, str]] = []
        self._next = 0                      # request numbers, unique in the window
        self._forget: int | None = None     # seconds before this one are past every window
        self._lock = Semaphore()
        self._pool: ThreadPool | None = None

    def add(self, samples: list, t: float) -> None:
        self._pending.append(batch_columns(samples, int(t), self._next, self._code))
        self._next += len(samples)

    def _code(self, name: str) -> int:
        got = self._codes.get(name)
        if got is None:
            got = self._codes[name] = len(self._codes)
            self._new_names.append((got, name))
        return got

    def forget_before(self, sec: int) -> None:
        self._forget = sec if self._forget is None else max(self._forget, sec)

    def figures(self, lo: int, hi: int, span_s: float) -> dict:
        """The figures of the requests that arrived in seconds [lo, hi)."""
        with self._lock:   # taken before the batches: a later query never overtakes them
            pending, self._pending = self._pending, []
            names, self._new_names = self._new_names, []
            forget, self._forget = self._forget, None
            broken = self._broken
            if self._pool is None:
                # one native thread of its own: a DuckDB connection serves one statement at a
                # time, and the hub's shared pool may hand two queries to two threads
                self._pool = ThreadPool(1)
            got = self._pool.apply(self._query, (pending, names, forget, lo, hi, span_s))
        if self._broken and not broken:
            log.error("servelab: the live window has no figures: %s", self._broken)
        return got

    def _query(self, pending, names, forget, lo, hi, span_s) -> dict:
        # On the threadpool's thread: DuckDB and numpy only (no logging: under Locust its locks
        # are gevent's, which belong to the event loop's thread).
        # Its queries wait for the loop's idle time, as the writer's do (a syscall a query, so a
        # thread the pool starts anew is lowered too).
        yield_core_to_the_loop()
        if self._db is None and not self._broken:
            try:
                self._db = LiveDb(self.slos)
            except (OSError, LookupError, duckdb.Error) as exc:
                self._broken = f"{type(exc).__name__}: {exc}"
        if self._db is None:
            return _shape(self.EMPTY, span_s)
        try:
            self._db.fold(pending, names)
            if forget is not None:
                self._db.forget(forget)
            return self._db.figures(lo, hi, span_s)
        except Exception as exc:  # noqa: BLE001 - the live view goes blank, never the run:
            # the stored rows are the result
            self._db, self._broken = None, f"{type(exc).__name__}: {exc}"
            return _shape(self.EMPTY, span_s)


def quantiles(values: list, qs=QS) -> list[float | None]:
    # None, not NaN: the view is JSON
    return [None if x != x else x for x in quantiles_cont(values, qs)]


def quantile(values: list, q: float) -> float | None:
    return quantiles(values, (q,))[0]
