"""The DuckDB file: open or create it, and append rows in batches.

Rows travel as NDJSON bytes (what the workers spool and ship) and enter the tables through
DuckDB's own JSON reader with the column types taken from the table itself, so a batch of a few
thousand requests with their chunk lists costs milliseconds and no Python per row. ``executemany``
is never used for data: it costs about a millisecond per row.

DuckDB allows one writing process per file; while it holds the file nobody else can open it, not
even read-only. ``open_db`` turns that into a clear ``DatabaseLocked`` error.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import duckdb
import orjson

from servelab.core.errors import ServelabError
from servelab.store import spans, telemetry
from servelab.store.quarantine import check_lines

SCHEMA_PATH = Path(__file__).with_name("schema.sql")
# Tables whose DDL lives beside their decoder and row type, applied after schema.sql.
MODULE_DDL = (spans.DDL, telemetry.DDL)
TABLES = ("runs", "run_classes", "stages", "requests", "server_metrics", "client_health",
          "run_workers", "stored_batches", "endpoint_events", "server_spans")


def schema_sql() -> str:
    """schema.sql and every module's DDL: all the tables servelab writes."""
    return SCHEMA_PATH.read_text(encoding="utf-8") + "".join(MODULE_DDL)


# The ITL sketch of a request (table itl_sketches; why and how: analysis/README.md, "Percentiles:
# exact, except ITL"): the histogram of its gaps' DDSketch buckets (servelab_sketch_bin, defined
# with the other chunk macros in schema.sql), per chunk and per token. Kept here, beside the insert
# it follows, because the writer must not import the analysis layer; the analysis layer backfills
# with it.
ITL_SKETCH_SELECT = """
SELECT run_id, request_id, gaps, gap_tokens, gap_sum_ms,
    -- one token per chunk (no speculative decoding): the token view is the chunk view; the
    -- repeat-per-token form below costs ~5x more, so it runs only where a chunk carries more
    CASE WHEN max_w = 1 THEN chunk_sketch ELSE CAST(list_aggregate(flatten(list_transform(
         list_zip(list_transform(list_zip(g, w), p -> servelab_sketch_bin(p[1] / p[2])), w),
         q -> list_resize([q[1]], q[2], q[1]))), 'histogram') AS MAP(INTEGER, BIGINT)) END
         AS token_sketch,
    chunk_sketch
FROM (
    SELECT run_id, request_id, g, w, len(g) AS gaps, list_sum(w) AS gap_tokens,
        list_sum(g) AS gap_sum_ms, list_max(w) AS max_w,
        CAST(list_aggregate(list_transform(g, x -> servelab_sketch_bin(x)), 'histogram')
             AS MAP(INTEGER, BIGINT)) AS chunk_sketch
    FROM (
        SELECT run_id, request_id,
            coalesce(servelab_chunk_gaps(chunk_offsets_ms), []) AS g,
            list_transform(range(2, coalesce(len(chunk_offsets_ms), 0) + 1),
                           i -> servelab_chunk_weight(chunk_tokens[i])) AS w
        FROM {source}
    )
)"""


# Per-request chunk scalars (columns of `requests`, after the recorded ones): what the views need of
# a request's chunk lists, computed from the row itself when it is read from its batch file, so
# that stage_summary reads a few numbers per request instead of unnesting every chunk (1 M
# requests x 256 chunks: 9.2 s -> 2.7 s side by side; bench/analysis.py). They depend on nothing
# but the row: a stage window, set after rows exist and cut short at Stop, is applied at query
# time. k_i and g_i are schema.sql's macros servelab_chunk_weight and servelab_chunk_gaps, which
# the views' lists chunk_weights and gaps_ms read too (tests/analysis/test_request_scalars.py
# holds the scalars against those lists on every shape). A file from before these columns, or rows
# inserted without them, are filled in place by ``fill_request_scalars`` (``views.install_views``
# calls it).
_N = "coalesce(len(chunk_offsets_ms), 0)"
_K = "servelab_chunk_weight(chunk_tokens[i])"
_GAPS = "servelab_chunk_gaps(chunk_offsets_ms)"
REQUEST_SCALARS = {
    "chunk_count": _N,                                                         # content chunks n
    "chunk_token_sum": f"list_sum(list_transform(range(1, {_N} + 1), lambda i: {_K}))",  # sum k_i
    "gap_token_sum": f"list_sum(list_transform(range(2, {_N} + 1), lambda i: {_K}))",    # sum k_i, i >= 2
    "gap_sum_ms": f"list_sum({_GAPS})",                                        # sum g_i
    "gap_mean_ms": f"list_avg({_GAPS})",                                       # mean g_i
    "gap_token_max_ms": (f"list_max(list_transform(range(2, {_N} + 1), lambda i: "   # max g_i / k_i
                         f"(chunk_offsets_ms[i] - chunk_offsets_ms[i - 1]) / {_K}))"),
    "first_chunk_ms": "chunk_offsets_ms[1]",                                   # offset_1
    "last_chunk_ms": f"chunk_offsets_ms[{_N}]",                                # offset_n
}
DERIVED_COLUMNS = {"requests": tuple(REQUEST_SCALARS)}


def request_scalars_sql() -> str:
    """The SELECT-list that adds the chunk scalars to a row source of ``requests`` columns."""
    return ", ".join(f"{expr} AS {name}" for name, expr in REQUEST_SCALARS.items())


def fill_request_scalars(con: duckdb.DuckDBPyConnection) -> int:
    """Compute the chunk scalars of the requests that lack them (``chunk_count`` NULL: a file from
    before these columns, or rows inserted around the Store), in place; returns how many. A
    complete file costs one scan of one integer column."""
    missing = con.execute("SELECT count(*) FROM requests WHERE chunk_count IS NULL").fetchone()[0]
    if missing > 10000:
        print(f"servelab: computing the chunk scalars of {missing:,} requests written without them "
              "(once per file; seconds per 100,000 requests of 256 chunks)", file=sys.stderr)
    if missing:
        sets = ", ".join(f"{name} = {expr}" for name, expr in REQUEST_SCALARS.items())
        con.execute(f"UPDATE requests SET {sets} WHERE chunk_count IS NULL")
    return missing


class DatabaseLocked(ServelabError):
    """Another process holds the DuckDB file."""


def open_db(path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating when needed) the database and apply the schema. The analysis views are the
    analysis layer's business: ``servelab.analysis.views.open_results_db`` adds them."""
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        raise ServelabError(f"{path}: no such database; run `servelab run` first or pass --db")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise DatabaseLocked(
                f"{path}: the database is in use by another process ({_holder(exc)}); wait for "
                "that run to finish, or give another file with --db") from None
        raise ServelabError(f"{path}: cannot open the database: {exc}") from None
    if not read_only:
        con.execute(schema_sql())
    return con


def _holder(exc) -> str:
    m = re.search(r"Conflicting lock is held in (.*?) \(PID (\d+)\)", str(exc))
    return f"{m.group(1)}, PID {m.group(2)}" if m else "a file lock"


def column_types(con, table: str) -> dict[str, str]:
    """The columns a row of `table` carries, with their types: what rows.py declares and a batch
    file holds. Derived columns (DERIVED_COLUMNS) are not among them: the store computes those."""
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = ? AND table_schema = 'main' ORDER BY ordinal_position", [table]
    ).fetchall()
    return {name: dtype for name, dtype in rows if name not in DERIVED_COLUMNS.get(table, ())}


class Store:
    """Batched writes into one open database. Use from one thread at a time."""

    def __init__(self, con: duckdb.DuckDBPyConnection, threads: int | None = None):
        self.con = con
        if threads:
            # On a load-generating host DuckDB's default (one thread per core) would take every
            # core for a moment at each batch, right under the streams being timed.
            con.execute(f"SET threads = {int(threads)}")
        # what a batch file may carry: the recorded columns (the derived ones are computed)
        self._types = {t: column_types(con, t) for t in TABLES}
        self._tables = {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
        self.repaired = 0   # rows stored with values set to NULL (why: their data_quality)
        self.dropped = 0    # rows no table would take, left out (logged)

    @staticmethod
    @contextmanager
    def batch_file(data: bytes):
        """``data`` as a file for DuckDB's JSON reader, removed once read. One file per batch,
        not one folder per store: a folder lived as long as its store, and every store a killed
        process or an unclosed ingest left behind kept its last batch of rows in /tmp."""
        fd, path = tempfile.mkstemp(prefix="servelab-batch-", suffix=".ndjson")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if not data.endswith(b"\n"):
                    f.write(b"\n")
            yield path
        finally:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def has_table(self, table: str) -> bool:
        return table in self._tables

    def columns_sql(self, table: str) -> str:
        types = self._types[table]
        return "{" + ", ".join(f"'{n}': '{t}'" for n, t in types.items()) + "}"

    def read_json_sql(self, table: str, path: str) -> str:
        # ignore_errors stays off: a bad row must fail loudly, not vanish (a failed batch goes
        # through ``store.quarantine``, which keeps every row it can).
        # For requests, the source carries its chunk scalars too, so every way a batch file enters
        # the table (append_ndjson, ingest's staging, the quarantine check) stores them with it.
        quoted = path.replace("'", "''")
        source = (f"read_json('{quoted}', format = 'newline_delimited', "
                  f"columns = {self.columns_sql(table)})")
        if table == "requests":
            source = f"(SELECT *, {request_scalars_sql()} FROM {source})"
        return source

    def append_ndjson(self, table: str, data: bytes, replace: bool = False,
                      checked: bool = False) -> None:
        """Append NDJSON rows (keys = column names; missing keys are NULL).

        ``checked``: first find the rows the table refuses (``store.quarantine``: the batch is
        split, those rows repaired or dropped, counted in ``repaired`` and ``dropped``), so the
        insert cannot fail on a value. For a batch that failed as is; it must not be called
        for every batch (a failing batch costs a few extra parses)."""
        if not data:
            return
        if checked:
            got = check_lines(self, table, [ln for ln in data.split(b"\n") if ln.strip()])
            self.repaired += got.repaired
            self.dropped += got.dropped
            if not got.lines:
                return
            data = b"\n".join(got.lines) + b"\n"
        verb = "INSERT OR REPLACE INTO" if replace else "INSERT INTO"
        with self.batch_file(data) as path:
            source = self.read_json_sql(table, path)
            if table == "requests" and "itl_sketches" in self._tables:
                # parsed once for both statements: the JSON parse and the chunk scalars were
                # half of the writer's CPU when the sketches read the batch file a second time
                self.con.execute("CREATE OR REPLACE TEMP TABLE servelab_batch AS SELECT * FROM "
                                 + source)
                source = "servelab_batch"
            self.con.execute(f"{verb} {table} BY NAME SELECT * FROM {source}")
        if source == "servelab_batch":
            self._sketch(source)
            self.con.execute("DROP TABLE servelab_batch")

    def _sketch(self, source: str) -> None:
        """The batch's ITL sketches, read from the same batch file (not from the table, which
        grows): a write that dies between the two statements leaves requests without a sketch,
        which the analysis layer backfills when it next opens the file."""
        if "itl_sketches" not in self._tables:
            return
        try:
            self.con.execute(f"INSERT INTO itl_sketches {ITL_SKETCH_SELECT.format(source=source)}")
        except duckdb.Error as exc:
            # The requests are stored; raising would make the caller store the batch again.
            logging.getLogger(__name__).warning("ITL sketches of a batch not written (%s); the "
                                                "next open of the file backfills them", exc)

    def append_rows(self, table: str, rows: list, replace: bool = False) -> None:
        """Rows of the table's ``store.rows`` type (orjson writes the dataclasses natively)."""
        if rows:
            self.append_ndjson(table, b"\n".join(orjson.dumps(r) for r in rows) + b"\n",
                               replace=replace)

    def close(self) -> None:
        self.con.close()
