"""The DuckDB file: open or create it, and append rows in batches.

Rows travel as NDJSON bytes (what the workers spool and ship) and enter the tables through
DuckDB's own JSON reader with the column types taken from the table itself, so a batch of a few
thousand requests with their chunk lists costs milliseconds and no Python per row. ``executemany``
is never used for data: it costs about a millisecond per row.

DuckDB allows one writing process per file; while it holds the file nobody else can open it, not
even read-only. ``open_db`` turns that into a clear ``DatabaseLocked`` error.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import duckdb
import orjson

from servelab.core.errors import ServelabError

SCHEMA_PATH = Path(__file__).with_name("schema.sql")
TABLES = ("runs", "run_classes", "stages", "requests", "server_metrics", "client_health",
          "run_workers")


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
        con.execute(SCHEMA_PATH.read_text(encoding="utf-8"))
    return con


def _holder(exc) -> str:
    m = re.search(r"Conflicting lock is held in (.*?) \(PID (\d+)\)", str(exc))
    return f"{m.group(1)}, PID {m.group(2)}" if m else "a file lock"


def column_types(con, table: str) -> dict[str, str]:
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = ? AND table_schema = 'main' ORDER BY ordinal_position", [table]
    ).fetchall()
    return {name: dtype for name, dtype in rows}


class Store:
    """Batched writes into one open database. Use from one thread at a time."""

    def __init__(self, con: duckdb.DuckDBPyConnection, threads: int | None = None):
        self.con = con
        if threads:
            # On a load-generating host DuckDB's default (one thread per core) would take every
            # core for a moment at each batch, right under the streams being timed.
            con.execute(f"SET threads = {int(threads)}")
        self._types = {t: column_types(con, t) for t in TABLES}
        self._dir = tempfile.mkdtemp(prefix="servelab-batch-")
        self.batch_path = os.path.join(self._dir, "batch.ndjson")

    def columns_sql(self, table: str) -> str:
        types = self._types[table]
        return "{" + ", ".join(f"'{n}': '{t}'" for n, t in types.items()) + "}"

    def read_json_sql(self, table: str, path: str) -> str:
        # ignore_errors stays off: a bad row must fail loudly, not vanish.
        quoted = path.replace("'", "''")
        return (f"read_json('{quoted}', format = 'newline_delimited', "
                f"columns = {self.columns_sql(table)})")

    def append_ndjson(self, table: str, data: bytes, replace: bool = False) -> None:
        """Append NDJSON rows (keys = column names; missing keys are NULL)."""
        if not data:
            return
        with open(self.batch_path, "wb") as f:
            f.write(data)
            if not data.endswith(b"\n"):
                f.write(b"\n")
        verb = "INSERT OR REPLACE INTO" if replace else "INSERT INTO"
        source = self.read_json_sql(table, self.batch_path)
        self.con.execute(f"{verb} {table} BY NAME SELECT * FROM {source}")

    def append_rows(self, table: str, rows: list, replace: bool = False) -> None:
        """Rows of the table's ``store.rows`` type (orjson writes the dataclasses natively)."""
        if rows:
            self.append_ndjson(table, b"\n".join(orjson.dumps(r) for r in rows) + b"\n",
                               replace=replace)

    def close(self) -> None:
        try:
            os.remove(self.batch_path)
        except FileNotFoundError:
            pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass
        self.con.close()
