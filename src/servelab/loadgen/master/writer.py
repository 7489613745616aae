"""The master's database writer: the only code that touches the DuckDB file during a run.

All database work happens in one real OS thread (a gevent ThreadPool of size 1): the event loop
only queues work and waits cooperatively, so a large insert never stalls Locust's heartbeats or
message handling. Everything queued since the last wake-up is stored in one transaction, then
each row batch is acknowledged to its worker; a batch number seen before is acknowledged again
and not stored twice. A failure of one source (a scrape the parser refuses, a call, a bad value)
fails only that source: the rest is stored apart, and a batch counts as stored only once the
database holds it (``stored_batches``, committed with its rows). Others read the file through
``store.read_side.ReadSide`` while the writer holds it.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque

import duckdb
import gevent
from gevent.event import Event
from gevent.queue import Queue

from servelab.loadgen.master import live_figures
from servelab.store.read_side import OPEN_LOCK, ReadSide
from servelab.loadgen.master.scraper import metric_rows
from servelab.store.db import Store
from servelab.store.rows import StoredBatch

log = logging.getLogger("servelab.loadgen")
MAX_ITEMS = 500   # queued items stored in one transaction
# Transactions at most this often (sooner when someone waits for the writer): a write costs
# ~13 ms of CPU whatever its size (DuckDB plans the chunk-figure and sketch statements and
# commits) and ~0.12 ms per request, so four a second (the workers' batches) cost three times
# the CPU of one, on the core the streams are read on in a one-process run.
WRITE_INTERVAL_S = 1.0
# The database thread yields the core to the event loop (Linux nice is per thread): a write in
# progress must not delay the stamping of a chunk that arrived.
DB_THREAD_NICE = 10
MARKS_KEPT = 1024   # writes remembered (the live window reads the last ten seconds' of them)
LIVE_TABLES = ("requests", "itl_sketches", "server_spans")


def _open_store(open_db, db_path: str) -> Store:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DB_THREAD_NICE)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the thread keeps the process's priority
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
        self.source_errors: dict[str, tuple[int, str]] = {}   # source -> (failures, last)
        self.on_scrape_error = None   # (t_unix, exc), from the database thread
        self._write_no = 0
        self._queue: Queue = Queue()
        self._pending = 0
        self._idle = Event()
        self._idle.set()
        self._flush = Event()
        self._hurry = False
        # DatabaseLocked is raised here, before anything is sent to the workers
        self.store = pool.apply(_open_store, (open_db, db_path))
        # (t_unix, *the ends of LIVE_TABLES) after each write: one past the last rowid
        self.marks: deque = deque(maxlen=MARKS_KEPT)
        pool.apply(self._note_ends)
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

    def hurry(self) -> None:
        """From now on, no waiting out the interval (the run is draining: every worker waits for
        its last acknowledgements, and the end of the run for the workers)."""
        self._hurry = True
        self._flush.set()

    def wait_idle(self, timeout_s: float) -> None:
        self._flush.set()   # no waiting out the write interval while someone waits
        self._idle.wait(timeout_s)

    def run_now(self, fn):
        """``fn(store)`` in the database thread, outside the queue; its result."""
        return self.pool.apply(fn, (self.store,))

    def live_figures(self, spans: list[dict], firsts: tuple) -> list[dict]:
        """The live window's statement (``live_figures.query``) over rowid spans of the rows
        this run stored, between two writes."""
        return self.run_now(lambda store: live_figures.query(store.con, self.run_id, spans,
                                                             firsts))

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
        last = 0.0
        while True:
            items = [self._queue.get()]
            self._flush.wait(max(0.0, last + WRITE_INTERVAL_S - time.monotonic()))
            last = time.monotonic()
            while not self._queue.empty() and len(items) < MAX_ITEMS:
                items.append(self._queue.get_nowait())
            try:
                acks = self.pool.apply(self._write, (items,))
            except Exception as exc:  # noqa: BLE001 - only a bug gets here; rows stay spooled
                self._failed("write", exc)
                acks = []
            for node_id, acct, batch_no, n_rows, fresh in acks:
                if fresh:
                    acct.stored += n_rows
                    acct.batches += 1
                self.ack(node_id, acct.worker, batch_no)
            self._pending -= len(items)
            if self._pending == 0:
                if not self._hurry:
                    self._flush.clear()
                self._idle.set()

    def notes(self) -> list[str]:
        """The run's notes on what was not stored as it came (a /metrics page the parser
        refused is left to the endpoint log's note, which names it by its outcome)."""
        out = [f"{source}: {count} write(s) not stored ({last})"
               + ("; no request row was lost for it" if source != "rows" else "")
               for source, (count, last) in sorted(self.source_errors.items())
               if source != "scrape"]
        if self.store.repaired or self.store.dropped:
            out.append(f"{self.store.repaired} rows stored with bad values set to NULL (see "
                       f"data_quality), {self.store.dropped} lines no table would take")
        return out

    def _failed(self, source: str, exc: BaseException) -> None:
        """A source that could not be stored: counted, named in the run's notes, never raised."""
        text = f"{type(exc).__name__}: {exc}"[:300]
        count, _ = self.source_errors.get(source, (0, ""))
        self.source_errors[source] = (count + 1, text)
        if count == 0:
            log.error("servelab: storing %s failed: %s", source, text)

    # ---- the database thread --------------------------------------------------------------
    # Every queued item is one source: a worker's row batch, a call, a scrape. They are stored
    # together in one transaction; when that fails, each source is stored on its own, row
    # batches first, so a failing scrape or call fails only itself. A batch counts as stored
    # once its transaction committed, as the database says (stored_batches), never before.
    def _write(self, items: list) -> list:
        batches, calls, scrapes, acks = self._sort(items)
        metrics = [m for m in (self._parse(t, text) for t, text in scrapes) if m]
        self._write_no += 1
        try:
            self._commit(batches, calls, metrics, self._write_no, checked=False)
        except Exception:  # noqa: BLE001 - any source's failure; each is retried alone
            self._rollback()
            if not self._landed(self._write_no):
                self._apart(batches, calls, metrics)
        acks.extend(b[:2] + (b[2]["batch"], b[2]["n_rows"], True) for b in batches
                    if b[2]["batch"] in b[1].stored_batches)
        self._note_ends()
        return acks

    def _note_ends(self) -> None:
        """How far `requests`, `itl_sketches` and `server_spans` reach now (the live window's
        rows are the spans between two writes: DuckDB numbers a table's rows in the order they
        were appended); a table the file lacks reaches 0."""
        ends = ", ".join(f"(SELECT coalesce(max(rowid) + 1, 0) FROM {t})"
                         if self.store.has_table(t) else "0" for t in LIVE_TABLES)
        try:
            got = self.store.con.execute(f"SELECT {ends}").fetchone()
        except duckdb.Error as exc:
            self._failed("live marks", exc)
            return
        self.marks.append((time.time(), *got))

    def _sort(self, items: list):
        batches, calls, scrapes, acks, seen = [], [], [], [], set()
        for item in items:
            if item[0] == "batch":
                _, node_id, data = item
                acct = self.accounts.get(data["worker"])
                key = (data["worker"], data["batch"])
                if data["batch"] in acct.stored_batches or key in seen:
                    acks.append((node_id, acct, data["batch"], data["n_rows"], False))
                else:
                    seen.add(key)
                    batches.append((node_id, acct, data))
            elif item[0] == "metrics":
                scrapes.append(item[1:])
            else:
                calls.append(item[1])
        return batches, calls, scrapes, acks

    def _parse(self, t_unix: float, text: str) -> bytes:
        try:
            return metric_rows(self.run_id, t_unix, text)
        except Exception as exc:  # noqa: BLE001 - a page the parser refuses is the server's
            self._failed("scrape", exc)
            if self.on_scrape_error is not None:
                self.on_scrape_error(t_unix, exc)
            return b""

    def _apart(self, batches: list, calls: list, metrics: list) -> None:
        """After a failed transaction: each source alone, row batches first."""
        for b in batches:
            for checked in (False, True):
                # checked: the rows a column refuses are repaired or dropped (counted), so a bad
                # value cannot keep a batch out forever
                self._write_no += 1
                try:
                    self._commit([b], [], [], self._write_no, checked=checked)
                    break
                except Exception as exc:  # noqa: BLE001
                    self._rollback()
                    if self._landed(self._write_no):
                        break
                    if checked:   # not acknowledged: the worker resends it later
                        self._failed("rows", exc)
        for source, call, chunk in ([("call", c, None) for c in calls]
                                    + [("metrics", None, m) for m in metrics]):
            self._write_no += 1
            try:
                self._commit([], [call] if call else [], [chunk] if chunk else [],
                             self._write_no, checked=source == "metrics")
            except Exception as exc:  # noqa: BLE001
                self._rollback()
                if not self._landed(self._write_no):
                    self._failed(source, exc)

    def _commit(self, batches: list, calls: list, metrics: list, write_no: int,
                checked: bool) -> None:
        store, con = self.store, self.store.con
        t = time.time()
        marks = [StoredBatch(self.run_id, d["worker"], d["batch"], d["n_rows"], write_no, t)
                 for _, _, d in batches] or [StoredBatch(self.run_id, None, None, 0, write_no, t)]
        con.execute("BEGIN TRANSACTION")
        for call in calls:
            call(store)
        store.append_ndjson("requests", b"".join(d["rows"] for _, _, d in batches if d["rows"]),
                            checked=checked)
        store.append_ndjson("client_health", b"".join(d["health"] for _, _, d in batches
                                                      if d["health"]), checked=checked)
        store.append_ndjson("server_metrics", b"".join(metrics), checked=checked)
        store.append_rows("stored_batches", marks)
        con.execute("COMMIT")
        self._mark(batches)

    def _mark(self, batches: list) -> None:
        for _, acct, data in batches:
            acct.stored_batches.add(data["batch"])

    def _rollback(self) -> None:
        try:
            self.store.con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction open: it failed before BEGIN, or after COMMIT

    def _landed(self, write_no: int) -> bool:
        """Whether write ``write_no`` committed (a failure can come after the commit); if so, its
        batches are marked stored."""
        try:
            got = self.store.con.execute(
                "SELECT worker, batch FROM stored_batches WHERE run_id = ? AND write_no = ?",
                [self.run_id, write_no]).fetchall()
        except duckdb.Error:
            return False
        for worker, batch in got:
            if worker is not None:
                self.accounts.get(worker).stored_batches.add(batch)
        return bool(got)
