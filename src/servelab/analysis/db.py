"""Opening the results database for reading (THE read path of every analysis command), and
finding runs in it. Writing goes through the store's ``open_db`` (``views.open_results_db``).

DuckDB allows one writing process per file: while ``servelab run`` writes, every other open of
the file fails, read-only ones included. Readers therefore open read-only, briefly, and say so
plainly when the file is busy, unless a servelab master holds it: then its sidecar
(``<db>.master.json``) says where the master answers read queries, and the reader gets a
connection through it (``remote``), so the commands work while a run is on. Views must exist:
when they are missing or were installed from an older analysis/*.sql, the reader installs them
(a short read-write open); if it cannot (another reader holds the file), it uses temporary copies
for its own connection.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import duckdb

from servelab.core.errors import ServelabError
from servelab.core.paths import default_db

from servelab.store import read_remote as remote
from .views import has_schema, install_views, open_results_db, stale_views, view_files


SIDECAR_WAIT_S = 1.0   # a run's writer opens or closes the file around its sidecar


def _lock_message(path: Path, exc: Exception) -> str:
    return (
        f"{path} is locked by another process ({exc}). DuckDB lets one process write a database "
        "file and then nobody else may open it, even read-only; a servelab master that holds it "
        f"answers reads itself through its JSON API (it announces that in {path}.master.json, "
        "absent here: a master started without it, or not a servelab master): wait for the "
        "run to finish, or query a copy (cp the file and pass --db COPY)"
    )


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


def resolve_db_path(path: str | Path | None) -> Path:
    db = Path(path) if path else default_db()
    if not db.exists():
        raise ServelabError(
            f"no database at {db}: record a run first (`servelab run ...` writes {default_db()}), "
            "or pass --db PATH (or set SERVELAB_DB) to an existing servelab DuckDB file"
        )
    if db.is_dir():
        raise ServelabError(f"{db} is a directory; --db takes the .duckdb file itself")
    return db


def _connect(db: Path, through_master: bool = False):
    """A read-only connection; when the file is locked, one through the master holding it."""
    # Not store.open_db: a reader must never create the file or apply the schema, and its lock
    # message says what a reader can do (wait, or read a copy).
    deadline = time.monotonic() + SIDECAR_WAIT_S
    while True:
        try:
            return duckdb.connect(str(db), read_only=True)
        except duckdb.Error as exc:
            if not _is_lock_error(exc):
                raise ServelabError(f"{db}: cannot open as a DuckDB database ({exc})") from exc
            con = remote.connect(db) if through_master else None
            if con is not None:
                return con
            if not through_master or time.monotonic() > deadline:
                raise ServelabError(_lock_message(db, exc)) from exc
            time.sleep(0.1)


def open_for_reading(path: str | Path | None = None):
    """A read-only connection to the results database with current analysis views: a DuckDB
    connection, or, while a servelab master holds the file, a ``remote.RemoteConnection``."""
    db = resolve_db_path(path)
    try:
        return _open_for_reading(db)
    except remote.MasterGone:
        return _open_for_reading(db)   # the run just ended: the file is free now


def _open_for_reading(db: Path):
    files = view_files()
    con = _connect(db, through_master=True)
    if getattr(con, "remote", False):
        if not has_schema(con):
            raise ServelabError(f"{db} has no servelab tables (runs, requests, ...)")
        if stale_views(con, files):
            raise ServelabError(
                f"the master that holds {db} installed its views from another analysis/*.sql "
                "than this servelab's (it was started from another version); read the file with "
                "the same version, or after its run ends")
        return con
    if not has_schema(con):
        con.close()
        raise ServelabError(
            f"{db} has no servelab tables (runs, requests, ...): it was not written by servelab; "
            "pass --db with a file that `servelab run` recorded"
        )
    if not stale_views(con, files):
        return con
    con.close()
    try:
        writer = open_results_db(db)  # the store's writer open, then the views
    except (ServelabError, duckdb.Error):
        # Another reader holds the file: install the views for this connection only.
        con = _connect(db)
        install_views(con, temporary=True)
        print(
            f"servelab: note: the views stored in {db} are missing or older than analysis/*.sql and "
            "the file is busy, so this command uses temporary copies",
            file=sys.stderr,
        )
        return con
    writer.close()
    return _connect(db)


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No file but the open database from here on: no ATTACH, COPY TO, EXPORT, file readers,
    extension loading, and no setting can be changed back (``servelab sql`` runs user SQL).
    The views read only tables, so they keep working. Through a master (a run is on) these
    settings would be the master's own, global to its database, whose writer reads files:
    it checks every query instead (read statements over its own tables and views only)."""
    if getattr(con, "remote", False):
        return
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def resolve_run(con: duckdb.DuckDBPyConnection, ref: str) -> str:
    """A run id from an exact id, a unique prefix of one, or ``latest``."""
    if ref == "latest":
        row = con.execute(
            "SELECT run_id FROM runs ORDER BY started_unix DESC NULLS LAST, run_id DESC LIMIT 1"
        ).fetchone()
        if not row:
            raise ServelabError("the database holds no runs yet, so there is no `latest`")
        return row[0]
    exact = con.execute("SELECT run_id FROM runs WHERE run_id = ?", [ref]).fetchone()
    if exact:
        return exact[0]
    matches = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE starts_with(run_id, ?) ORDER BY started_unix", [ref]
    ).fetchall()]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[:8]) + (" ..." if len(matches) > 8 else "")
        raise ServelabError(f"run '{ref}' is ambiguous: it starts {len(matches)} run ids ({shown}); give more characters")
    raise ServelabError(f"no run '{ref}' in the database; `servelab runs` lists the run ids (or use `latest`)")


def resolve_runs(con: duckdb.DuckDBPyConnection, refs: list[str]) -> list[str]:
    seen: list[str] = []
    for ref in refs:
        run_id = resolve_run(con, ref)
        if run_id not in seen:
            seen.append(run_id)
    return seen


def fetch_dicts(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
