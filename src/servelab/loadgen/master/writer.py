"""The master's database writer: the only code that touches the DuckDB file during a run.

All database work happens in one real OS thread (a gevent ThreadPool of size 1): the event loop
only queues work and waits cooperatively, so a large insert never stalls Locust's heartbeats or
message handling. Everything queued since the last wake-up is stored in one transaction, then
each row batch is acknowledged to its worker; a batch number seen before is acknowledged again
and not stored twice. Others read the file through ``reads.ReadSide`` while the writer holds it.
"""
from __future__ import annotations

import logging

import duckdb
import gevent
from gevent.event import Event
from gevent.queue import Queue

from servelab.loadgen.master.reads import OPEN_LOCK, ReadSide
from servelab.loadgen.master.scraper import metric_rows
from servelab.store.db import Store

log = logging.getLogger("servelab.loadgen")
MAX_ITEMS = 500   # queued items stored in one transaction


def _open_store(open_db, db_path: str) -> Store:
    with OPEN_LOCK:   # never while a reader of this process has the file open read-only
        return Store(open_db(db_path), threads=1)


class DbWriter:
    """``open_db(path)`` opens the file for writing (the locustfile passes the analysis layer's
    ``open_results_db``, which also installs the views); ``accounts`` knows which batches each
    worker had stored; ``ack(node_id, worker, batch)`` answers a worker once its batch is in."""

    def __init__(self, pool, open_db, db_path: str, run_id: str, accounts, ack):
        self.pool = pool
        self.run_id = run_id
        self.accounts = accounts
        self.ack = ack
        self.error: str | None = None
        self._queue: Queue = Queue()
        self._pending = 0
        self._idle = Event()
        self._idle.set()
        # DatabaseLocked is raised here, before anything is sent to the workers
        self.store = pool.apply(_open_store, (open_db, db_path))
        self.reads = ReadSide(self.store.con, db_path, run_id)
        self._greenlet = gevent.spawn(self._loop)

    # ---- queueing (event loop) ------------------------------------------------------------
    def call(self, fn) -> None:
        """``fn(store)`` in the next transaction."""
        self._put(("call", fn))

    def batch(self, node_id: str, data: dict) -> None:
        self._put(("batch", node_id, data))

    def metrics(self, t_unix: float, text: str) -> None:
        self._put(("metrics", t_unix, text))

    def wait_idle(self, timeout_s: float) -> None:
        self._idle.wait(timeout_s)

    def run_now(self, fn):
        """``fn(store)`` in the database thread, outside the queue; its result."""
        return self.pool.apply(fn, (self.store,))

    def close(self) -> None:
        self._greenlet.kill(block=False)
        try:
            self.reads.close()
        finally:
            self.pool.apply(self.store.close)

    def _put(self, item) -> None:
        self._pending += 1
        self._idle.clear()
        self._queue.put(item)

    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            while not self._queue.empty() and len(items) < MAX_ITEMS:
                items.append(self._queue.get_nowait())
            try:
                acks = self.pool.apply(self._write, (items,))
            except Exception as exc:  # noqa: BLE001 - rows stay spooled; workers resend
                self.error = f"{type(exc).__name__}: {exc}"
                log.error("servelab: storing a batch failed: %s", self.error)
                acks = []
            for node_id, acct, batch_no, n_rows, fresh in acks:
                if fresh:
                    acct.stored += n_rows
                    acct.batches += 1
                self.ack(node_id, acct.worker, batch_no)
            self._pending -= len(items)
            if self._pending == 0:
                self._idle.set()

    # ---- the database thread --------------------------------------------------------------
    def _write(self, items: list) -> list:
        try:
            return self._write_once(items, False)
        except duckdb.Error:
            # a value a column refuses failed the transaction: once more with every row batch
            # checked, so the good rows land and the bad ones are repaired or dropped (counted
            # in store.repaired / store.dropped), never resent forever
            return self._write_once(items, True)

    def _write_once(self, items: list, checked: bool) -> list:
        store = self.store
        con = store.con
        rows, health, metrics, calls, acks = [], [], [], [], []
        for item in items:
            if item[0] == "batch":
                _, node_id, data = item
                acct = self.accounts.get(data["worker"])
                key = data["batch"]
                fresh = key not in acct.stored_batches
                if fresh:
                    acct.stored_batches.add(key)
                    if data["rows"]:
                        rows.append(data["rows"])
                    if data["health"]:
                        health.append(data["health"])
                acks.append((node_id, acct, key, data["n_rows"], fresh))
            elif item[0] == "metrics":
                metrics.append(metric_rows(self.run_id, item[1], item[2]))
            else:
                calls.append(item[1])
        con.execute("BEGIN TRANSACTION")
        try:
            for call in calls:
                call(store)
            store.append_ndjson("requests", b"".join(rows), checked=checked)
            store.append_ndjson("client_health", b"".join(health), checked=checked)
            store.append_ndjson("server_metrics", b"".join(metrics), checked=checked)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            for _, acct, key, _, fresh in acks:
                if fresh:
                    acct.stored_batches.discard(key)
            raise
        return acks
