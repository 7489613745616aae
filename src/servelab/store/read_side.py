"""Reads of the results database by others while this master holds it (the JSON API, and
through it ``servelab runs``, ``summary``, ``report``, ``sql``).

DuckDB lets no other process open the file while the writer has it, so reads come here. They
run on a cursor of the writer's own connection (DuckDB's MVCC: a read sees committed batches and
never waits for, or holds up, the writer's transaction), in an OS thread of their own (the event
loop and the writer's thread are never the ones that wait), one at a time, each with a time
limit after which it is interrupted. While a writer is open its sidecar tells readers where this
master's API listens (``store.readers``).

Between runs nothing holds the file in this process: ``read_file`` opens it read-only for one
read, under the same lock the writer's open takes (DuckDB refuses a read-write open in a process
that has the file open read-only, and the reverse).
"""
from __future__ import annotations

import logging
import threading

import duckdb
import gevent
from gevent.threadpool import ThreadPool

from servelab.store import readers

log = logging.getLogger("servelab.loadgen")
QUERY_TIMEOUT_S = 120.0   # then the query is interrupted: a reader's mistake must not run all day
OPEN_LOCK = threading.Lock()   # this process's opens of the results file


class ReaderClosed(Exception):
    """The writer closed (the run ended): read the file directly now."""


class ReadTimeout(Exception):
    pass


class Endpoint:
    """Where this process answers readers (set by the JSON API once it listens): the sidecar's
    URL. None: no API, so no sidecar, and readers are told the file is locked."""
    url: str | None = None


class ReadSide:
    """Reads beside one writer (one per run); ``con`` is the writer's connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, db_path: str, run_id: str):
        self.db_path = db_path
        self.cursor = con.cursor()
        self.pool = ThreadPool(1)
        self.closed = False
        self.guard = None   # read_guard.Guard, built by the first query that needs one
        self.sidecar: dict | None = None
        if Endpoint.url:
            try:
                self.sidecar = readers.publish(db_path, Endpoint.url, run_id)
            except OSError as exc:   # readers then see the plain lock message
                log.warning("servelab: cannot publish %s: %s", readers.sidecar_path(db_path), exc)

    @property
    def token(self) -> str | None:
        return self.sidecar["token"] if self.sidecar else None

    def run(self, fn, timeout_s: float = QUERY_TIMEOUT_S):
        """``fn(cursor)`` in the read thread; its result. Waits cooperatively (event loop)."""
        if self.closed:
            raise ReaderClosed()
        job = self.pool.spawn(fn, self.cursor)
        try:
            return job.get(timeout=timeout_s)
        except gevent.Timeout:
            self.cursor.interrupt()
            raise ReadTimeout(f"the query ran past {timeout_s:.0f} s and was interrupted") \
                from None

    def close(self) -> None:
        """Before the writer's connection closes (an open cursor would keep the file locked)."""
        if self.closed:
            return
        self.closed = True
        if self.sidecar:
            try:
                readers.withdraw(self.db_path, self.sidecar["token"])
            except OSError as exc:
                log.warning("servelab: cannot remove the sidecar: %s", exc)
        self.cursor.interrupt()
        try:
            self.pool.spawn(self.cursor.close).get(timeout=10)
        except gevent.Timeout:
            log.warning("servelab: a read did not stop within 10 s of the run's end")
        self.pool.kill()


def read_file(db_path: str, fn):
    """``fn(con)`` on a short read-only open of the file (no run holds it here). Blocks: call it
    in a thread, never on the event loop."""
    with OPEN_LOCK:
        con = duckdb.connect(str(db_path), read_only=True)
        try:
            return fn(con)
        finally:
            con.close()
