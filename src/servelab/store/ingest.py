"""``servelab ingest SPOOL...``: load the rows a worker spooled but never got stored.

Rows already in the database are skipped by (run_id, worker, worker_seq) (health samples by
(run_id, worker, t_unix)), so ingesting a spool twice, or one whose rows were mostly shipped, is
safe. The run's ``run_workers`` row is brought up to date with exact figures from the spool.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.store import runs as run_record
from servelab.store.db import Store, open_db
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
    torn: int             # lines cut short by the kill, skipped
    run_known: bool


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
        for path in spools:
            reports.append(_ingest_one(store, path))
        for run_id in sorted({r.run_id for r in reports if r.run_known}):
            run_record.finish(con, run_id)
    finally:
        store.close()
    return reports


def _ingest_one(store: Store, path: Path) -> IngestReport:
    con = store.con
    spool = read_spool(path)
    run_id, worker = spool.meta["run_id"], spool.meta["worker"]
    before = _count(con, "requests", run_id, worker)
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
                        spool.in_flight_lost, spool.torn, bool(known))


def _stage(store: Store, table: str, lines: list[bytes]) -> None:
    path = store.batch_path
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    store.con.execute("DROP TABLE IF EXISTS incoming")
    source = store.read_json_sql(table, path)
    store.con.execute(f"CREATE TEMP TABLE incoming AS SELECT * FROM {source}")


def _count(con, table: str, run_id: str, worker: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ? AND worker = ?",
                       [run_id, worker]).fetchone()[0]
