"""Install the named SQL views of ``analysis/*.sql`` into a DuckDB database.

Files are named ``NN_name.sql`` and run in that order, so a view only reads tables and views of
lower-numbered files. Every view is persisted in the database file (plain SQL, no Python UDFs), so
``duckdb results/servelab.duckdb`` and ``SELECT * FROM stage_summary`` work without servelab.
Each installed view carries a comment: its file's definition text plus a hash of the file, which
tells a reader both what the view means and whether the file has changed since it was installed.
"""
from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb

from servelab.core.errors import ServelabError
from servelab.core.paths import analysis_dir
from servelab.specs.server_kinds import KINDS

VIEW_FILE = re.compile(r"^\d+_[a-z0-9_]+\.sql$")
CREATED = re.compile(r"CREATE\s+OR\s+REPLACE\s+(VIEW|MACRO)\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
SCHEMA_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \(.*?\n\);", re.DOTALL)
# The store's macros (what a request's chunk lists mean; schema.sql), which the views read.
SCHEMA_MACRO = re.compile(r"^CREATE OR REPLACE MACRO \w+\(.*?;$", re.MULTILINE | re.DOTALL)
SCHEMA_COLUMN = re.compile(r"^ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+) [^;]+;", re.MULTILINE)
STAMP = re.compile(r"\[servelab (\S+) sha256:([0-9a-f]+)\]\s*$")
# Where a view file takes the server kinds' metric names (each kind's package owns its own).
KIND_ROWS = re.compile(r"^ *-- server kinds' rows:.*$", re.MULTILINE)


def _with_kind_rows(sql: str) -> str:
    """The file with every server kind's (kind, canonical, exposed) rows written in, so the
    installed view is plain SQL and a new kind's package is all it takes."""
    rows = ",\n".join(f"    ('{kind.name}', '{canonical}', '{exposed}')"
                      for kind in KINDS.values()
                      for canonical, exposed in kind.view_metrics.items())
    return KIND_ROWS.sub(lambda _: rows, sql)


@dataclass(frozen=True)
class ViewFile:
    path: Path
    sql: str
    views: tuple[str, ...]
    macros: tuple[str, ...]
    definition: str
    digest: str

    @property
    def stamp(self) -> str:
        return f"[servelab {self.path.name} sha256:{self.digest}]"

    def comment(self) -> str:
        return f"{self.definition}\n{self.stamp}"


def _definition(sql: str) -> str:
    lines = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].rstrip())
    return "\n".join(lines).strip()


class SqlFolderMissing(ServelabError):
    """analysis/*.sql is not where servelab looks (SERVELAB_HOME points elsewhere)."""


def view_files(folder: Path | None = None) -> list[ViewFile]:
    folder = Path(folder) if folder else analysis_dir()
    if not folder.is_dir():
        raise SqlFolderMissing(
            f"{folder}: the analysis SQL folder is missing; set SERVELAB_HOME to the servelab "
            "checkout that holds analysis/*.sql"
        )
    files = []
    for path in sorted(folder.glob("*.sql")):
        if not VIEW_FILE.match(path.name):
            continue
        sql = _with_kind_rows(path.read_text(encoding="utf-8"))
        created = CREATED.findall(sql)
        definition = _definition(sql)
        if not created:
            raise ServelabError(f"{path}: no `CREATE OR REPLACE VIEW name AS ...`; every view file defines a view")
        if not definition:
            raise ServelabError(f"{path}: starts without a `-- name: definition` comment; state the formula first")
        files.append(
            ViewFile(
                path=path,
                sql=sql,
                views=tuple(n for kind, n in created if kind.upper() == "VIEW"),
                macros=tuple(n for kind, n in created if kind.upper() == "MACRO"),
                definition=definition,
                digest=hashlib.sha256(sql.encode()).hexdigest()[:16],
            )
        )
    if not files:
        raise ServelabError(f"{folder}: no NN_name.sql view files")
    return files


def view_names(files: list[ViewFile] | None = None) -> list[str]:
    return [v for f in (files or view_files()) for v in f.views]


def _installed_stamps(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    rows = con.execute(
        "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'"
    ).fetchall()
    stamps = {}
    for name, comment in rows:
        match = STAMP.search(comment or "")
        stamps[name] = match.group(0) if match else ""
    return stamps


def stale_views(con: duckdb.DuckDBPyConnection, files: list[ViewFile] | None = None) -> list[str]:
    """Views that are missing from the database or were installed from a different file text."""
    files = files or view_files()
    installed = _installed_stamps(con)
    return [v for f in files for v in f.views if installed.get(v) != f.stamp]


def has_schema(con: duckdb.DuckDBPyConnection) -> bool:
    names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
    return {"runs", "run_classes", "stages", "requests", "server_metrics", "client_health", "run_workers"} <= names


def _add_missing_tables(con: duckdb.DuckDBPyConnection, temporary: bool) -> None:
    """Tables that schema.sql gained after this file was created (e.g. ``fidelity``), so the views
    over them can be installed. A read-only reader gets empty TEMP tables instead."""
    from servelab.store.db import schema_sql

    present = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
    for match in SCHEMA_TABLE.finditer(schema_sql()):
        if match.group(1) not in present:
            ddl = match.group(0)
            if temporary:
                ddl = ddl.replace("CREATE TABLE", "CREATE TEMP TABLE", 1)
            con.execute(ddl)


def _add_store_macros(con: duckdb.DuckDBPyConnection, temporary: bool) -> None:
    """The store's macros, which the views read: a writer's ``open_db`` puts them in the file, but
    a file from before them, opened read-only or around ``open_db``, lacks them."""
    from servelab.store.db import schema_sql

    for match in SCHEMA_MACRO.finditer(schema_sql()):
        sql = match.group(0)
        con.execute(sql.replace("OR REPLACE MACRO", "OR REPLACE TEMP MACRO", 1) if temporary else sql)


def _add_missing_columns(con: duckdb.DuckDBPyConnection, temporary: bool) -> None:
    """Columns that schema.sql gained after this file was created. A writer adds them (the chunk
    scalars are then filled by ``fill_request_scalars``). A read-only reader cannot: when the
    file's ``requests`` lacks the chunk scalars, or some rows lack their values, it reads
    ``requests`` through a TEMP view of the same name that computes them from the chunk lists
    (slower, same figures), for its own connection only."""
    from servelab.store.db import REQUEST_SCALARS, SCHEMA_PATH

    if not temporary:
        for match in SCHEMA_COLUMN.finditer(SCHEMA_PATH.read_text(encoding="utf-8")):
            con.execute(match.group(0))
        return
    # the file's own table: in the TEMP catalog, plain main.requests would be the view itself
    table = f'"{con.execute("SELECT current_database()").fetchone()[0]}".main.requests'
    have = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' AND "
        "table_name = 'requests'").fetchall()}
    if all(name in have for name in REQUEST_SCALARS):
        if not con.execute(f"SELECT count(*) FROM {table} WHERE chunk_count IS NULL").fetchone()[0]:
            return
        fill = ", ".join(f"coalesce({name}, {expr}) AS {name}" for name, expr in REQUEST_SCALARS.items())
        con.execute(f"CREATE OR REPLACE TEMP VIEW requests AS SELECT * REPLACE ({fill}), rowid "
                    f"FROM {table}")
    else:
        stale = [n for n in REQUEST_SCALARS if n in have]
        keep = f"* EXCLUDE ({', '.join(stale)})" if stale else "*"
        scalars = ", ".join(f"{expr} AS {name}" for name, expr in REQUEST_SCALARS.items())
        # rowid rides along: request_metrics.request_rowid is how stage_summary finds a row's lists
        con.execute(f"CREATE OR REPLACE TEMP VIEW requests AS SELECT {keep}, {scalars}, rowid "
                    f"FROM {table}")


def backfill_sketches(con: duckdb.DuckDBPyConnection) -> int:
    """Sketch the requests that have none (a database written before itl_sketches existed, or a
    write that died between a batch and its sketches), in place; returns how many. The keys are
    compared first, on their own, so a file that is complete costs one scan of two columns."""
    from servelab.store.db import ITL_SKETCH_SELECT

    missing = con.execute(
        "SELECT count(*) FROM (SELECT run_id, request_id FROM requests r WHERE NOT EXISTS ("
        "SELECT 1 FROM itl_sketches s WHERE s.run_id IS NOT DISTINCT FROM r.run_id "
        "AND s.request_id IS NOT DISTINCT FROM r.request_id))").fetchone()[0]
    if missing > 10000:
        print(f"servelab: sketching the ITL samples of {missing:,} requests written without sketches "
              "(once per file; about a minute per 500,000 requests of 256 chunks)", file=sys.stderr)
    if missing:
        con.execute("CREATE OR REPLACE TEMP TABLE servelab_unsketched AS SELECT run_id, request_id FROM "
                    "requests r WHERE NOT EXISTS (SELECT 1 FROM itl_sketches s WHERE s.run_id IS NOT "
                    "DISTINCT FROM r.run_id AND s.request_id IS NOT DISTINCT FROM r.request_id)")
        source = ("(SELECT r.* FROM requests r SEMI JOIN servelab_unsketched u ON u.run_id IS NOT "
                  "DISTINCT FROM r.run_id AND u.request_id IS NOT DISTINCT FROM r.request_id)")
        con.execute(f"INSERT INTO itl_sketches {ITL_SKETCH_SELECT.format(source=source)}")
        con.execute("DROP TABLE servelab_unsketched")
    return missing


def install_views(con: duckdb.DuckDBPyConnection, folder: Path | None = None, temporary: bool = False) -> list[str]:
    """Create or replace every view (and macro) of analysis/*.sql, in file order, in one transaction.

    The writer (``servelab run``) calls this when it creates the database; readers call it when
    views are missing or stale. ``temporary=True`` creates TEMP views instead (for a read-only
    connection: they shadow the stored ones for this connection only).
    """
    files = view_files(folder)
    if not has_schema(con):
        raise ServelabError(
            "the database has no servelab tables (runs, requests, ...); it was not created by servelab "
            "(create it with `servelab run`, which applies src/servelab/store/schema.sql)"
        )
    con.execute("BEGIN TRANSACTION")
    try:
        _add_store_macros(con, temporary)
        _add_missing_tables(con, temporary)
        _add_missing_columns(con, temporary)
        if not temporary:
            from servelab.store.db import fill_request_scalars

            fill_request_scalars(con)
        # A read-only reader can fill only a TEMP itl_sketches (the file had none); the file's own
        # table is complete unless a write died mid-batch, and the next writer's open fills it.
        if not temporary or con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = "
                                        "'itl_sketches' AND temporary").fetchone()[0]:
            backfill_sketches(con)
        for f in files:
            sql = f.sql
            if temporary:
                sql = re.sub(r"CREATE\s+OR\s+REPLACE\s+(VIEW|MACRO)", r"CREATE OR REPLACE TEMP \1", sql, flags=re.IGNORECASE)
            try:
                con.execute(sql)
            except duckdb.Error as exc:
                raise ServelabError(f"{f.path}: {exc}; fix the SQL (or restore the file from git)") from exc
            comment = f.comment().replace("'", "''")
            for view in f.views:
                con.execute(f"COMMENT ON VIEW {view} IS '{comment}'")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return view_names(files)


def open_results_db(path) -> duckdb.DuckDBPyConnection:
    """Open a results database for writing with the schema and the views in place, so that the
    plain ``duckdb`` shell finds ``stage_summary`` and friends in the file. Writers above the store
    (the load generator's master, predict, verify, fidelity, ingest) open it through here."""
    from servelab.store.db import open_db

    con = open_db(path)
    try:
        install_views(con)
    except SqlFolderMissing:
        pass  # a writer without the SQL folder still records; readers install the views later
    except BaseException:
        con.close()
        raise
    return con
