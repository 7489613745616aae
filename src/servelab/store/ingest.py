"""``servelab ingest SPOOL...``: load the rows a worker spooled but never got stored.

Rows already in the database are skipped by (run_id, worker, worker_seq) (health samples by
(run_id, worker, t_unix)), so ingesting a spool twice, or one whose rows were mostly shipped, is
safe. The run's ``run_workers`` row is brought up to date with exact figures from the spool.

A run whose master died (SIGKILL, a crash, the host lost) stays ``running`` in the table.
``resolve_abandoned`` ends it: a master holds the DuckDB file for the whole run, so a process that
can open the file for writing knows that every ``running`` run in it has no master any more.
``servelab ingest``, ``servelab runs`` and ``servelab run`` (after its master exited) call it.
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.core.bars import track
from servelab.core.errors import ServelabError
from servelab.store import runs as run_record
from servelab.store.db import DatabaseLocked, Store, open_db
from servelab.store.quarantine import Checked, check_lines
from servelab.store.rows import WorkerAccount
from servelab.store.spool import find_spools, read_spool


@dataclass
class IngestReport:
    path: Path
    run_id: str
    worker: str
    spooled: int          # valid request rows in the spool
    added: int            # rows that were missing from the database
    health_added: int
    in_flight_lost: int   # sent but never finished when the worker ended
    torn: int             # lines cut short by the kill (or no row at all), skipped
    run_known: bool
    repaired: int = 0     # rows stored with values set to NULL (why: their data_quality)
    rejected: int = 0     # rows no table would take, skipped (logged)


def ingest(db_path, paths) -> list[IngestReport]:
    spools = []
    for p in paths:
        found = find_spools(p)
        if not found:
            raise ServelabError(f"{p}: no spool here (a folder with meta.json and "
                                "requests.ndjson, as written under results/spool/RUN/WORKER)")
        spools += found
    con = open_db(db_path)
    store = Store(con)
    reports = []
    try:
        for path in track(spools, "ingesting spools"):
            reports.append(_ingest_one(store, path))
        for run_id in sorted({r.run_id for r in reports if r.run_known}):
            run_record.finish(con, run_id)
        _resolve(store)
    finally:
        store.close()
    return reports


@dataclass
class Resolved:
    run_id: str
    stored: int           # request rows the run has now
    added: int            # rows loaded from its workers' spools
    in_flight_lost: int


def resolve_abandoned(db_path) -> list[Resolved]:
    """Mark every ``running`` run of ``db_path`` whose master is gone ``interrupted``, after
    loading the rows its workers spooled on this host. A file held by a live master is left
    alone (its run is really running): returns []."""
    import duckdb

    if not Path(db_path).is_file():
        return []
    try:
        con = duckdb.connect(str(db_path))
    except duckdb.Error:
        return []   # held by a live master (or no DuckDB file): nothing to resolve here
    try:
        running = con.execute("SELECT count(*) FROM information_schema.columns WHERE "
                              "table_name = 'runs' AND column_name = 'status'").fetchone()[0] \
            and con.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone()[0]
    except duckdb.Error:
        running = 0
    if not running:
        con.close()
        return []
    con.close()
    try:
        con = open_db(db_path)
    except DatabaseLocked:
        return []
    store = Store(con)
    try:
        return _resolve(store)
    finally:
        store.close()


def _resolve(store: Store) -> list[Resolved]:
    con = store.con
    out = []
    running = con.execute("SELECT run_id, settings, notes FROM runs WHERE status = 'running' "
                          "ORDER BY started_unix").fetchall()
    for run_id, settings, notes in running:
        try:
            spool_root = json.loads(settings or "{}").get("spool_dir") or "results/spool"
        except (ValueError, AttributeError):
            spool_root = "results/spool"
        run_dir = Path(spool_root) / run_id
        reports = []
        for path in (find_spools(run_dir) if run_dir.is_dir() else []):
            try:
                reports.append(_ingest_one(store, path))
            except (ServelabError, OSError, ValueError):
                continue   # a spool it cannot read: the note below still ends the run
        run_record.finish(con, run_id)
        stored = con.execute("SELECT count(*) FROM requests WHERE run_id = ?",
                             [run_id]).fetchone()[0]
        lost = sum(r.in_flight_lost for r in reports)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        note = (f"the master stopped without ending the run (killed or crashed); resolved to "
                f"interrupted at {when} with {stored} rows stored, {sum(r.added for r in reports)} "
                f"of them from {len(reports)} worker spool(s), {lost} requests in flight lost")
        con.execute("UPDATE runs SET status = 'interrupted', finished_unix = coalesce("
                    "finished_unix, (SELECT max(sent_unix + coalesce(e2e_ms, 0) / 1000.0) "
                    "FROM requests WHERE run_id = ?)), notes = ? WHERE run_id = ?",
                    [run_id, "; ".join(n for n in (notes, note) if n), run_id])
        out.append(Resolved(run_id, stored, sum(r.added for r in reports), lost))
    return out


def _ingest_one(store: Store, path: Path) -> IngestReport:
    con = store.con
    spool = read_spool(path)
    run_id, worker = spool.meta["run_id"], spool.meta["worker"]
    before = _count(con, "requests", run_id, worker)
    # outside the transaction (a refused value would abort it): the lines the tables take
    checked = {t: check_lines(store, t, lines) if lines else Checked()
               for t, lines in (("requests", spool.requests), ("client_health", spool.health))}
    spool.requests, spool.health = checked["requests"].lines, checked["client_health"].lines
    con.execute("BEGIN TRANSACTION")
    try:
        if spool.requests:
            _stage(store, "requests", spool.requests)
            con.execute(
                """
                INSERT INTO requests BY NAME
                SELECT * EXCLUDE (rn) FROM (
                    SELECT i.*, row_number() OVER (PARTITION BY i.worker_seq) AS rn
                    FROM incoming i
                    WHERE NOT EXISTS (SELECT 1 FROM requests r WHERE r.run_id = i.run_id
                                      AND r.worker = i.worker AND r.worker_seq = i.worker_seq))
                WHERE rn = 1
                """)
        health_before = _count(con, "client_health", run_id, worker)
        if spool.health:
            _stage(store, "client_health", spool.health)
            con.execute(
                """
                INSERT INTO client_health BY NAME
                SELECT DISTINCT i.* FROM incoming i
                WHERE NOT EXISTS (SELECT 1 FROM client_health h WHERE h.run_id = i.run_id
                                  AND h.worker = i.worker AND h.t_unix = i.t_unix)
                """)
        after = _count(con, "requests", run_id, worker)
        health_added = _count(con, "client_health", run_id, worker) - health_before
        known = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        produced = len(spool.seqs)
        existing = con.execute("SELECT produced, status FROM run_workers WHERE run_id = ? AND "
                               "worker = ?", [run_id, worker]).fetchone()
        if existing is None:
            store.append_rows("run_workers", [WorkerAccount(
                run_id, worker, spool.meta.get("host", socket.gethostname()), produced, after,
                spool.in_flight_lost, "recovered", str(path))])
        else:
            status = existing[1] if existing[1] == "finished" else "recovered"
            con.execute("UPDATE run_workers SET produced = greatest(coalesce(produced, 0), ?), "
                        "stored = ?, in_flight_lost = ?, status = ?, spool_path = ? "
                        "WHERE run_id = ? AND worker = ?",
                        [produced, after, spool.in_flight_lost, status, str(path), run_id,
                         worker])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        con.execute("DROP TABLE IF EXISTS incoming")
    return IngestReport(path, run_id, worker, len(spool.requests), after - before, health_added,
                        spool.in_flight_lost, spool.torn, bool(known),
                        sum(c.repaired for c in checked.values()),
                        sum(c.dropped for c in checked.values()))


def _stage(store: Store, table: str, lines: list[bytes]) -> None:
    store.con.execute("DROP TABLE IF EXISTS incoming")
    with store.batch_file(b"\n".join(lines)) as path:
        store.con.execute(f"CREATE TEMP TABLE incoming AS SELECT * FROM "
                          f"{store.read_json_sql(table, path)}")


def _count(con, table: str, run_id: str, worker: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ? AND worker = ?",
                       [run_id, worker]).fetchone()[0]
