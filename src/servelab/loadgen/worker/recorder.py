"""Worker side of the recording pipeline: spool first, then ship to the master until acknowledged.

Each finished request becomes one orjson line, written at once to the local spool (one
``os.write``, microseconds) and queued for shipping. A shipper greenlet sends the queue to the
master every ``interval_s`` as one custom message (``messages.ROWS``) with a batch number; the
master stores the batch and answers ``messages.ACK``. Unacknowledged batches are sent again, and
the master ignores a batch number it already stored, so nothing is stored twice or lost silently.
Every batch also carries the worker's counters (requests started and produced), so the master
knows what a worker had produced even if it dies before the end.
"""
from __future__ import annotations

import logging
import time

import gevent
import orjson

from servelab.loadgen import messages
from servelab.store.rows import HealthRow, RequestRow
from servelab.store.spool import Spool

log = logging.getLogger("servelab.loadgen")
MAX_BATCH_BYTES = 1 << 20


class Recorder:
    def __init__(self, runner, run_id: str, worker: str, spool: Spool,
                 interval_s: float = 0.25, resend_after_s: float = 5.0):
        self.runner = runner
        self.run_id = run_id
        self.worker = worker
        self.spool = spool
        self.interval_s = interval_s
        self.resend_after_s = resend_after_s
        self.started = 0        # worker_seq values handed out
        self.produced = 0       # request rows written to the spool
        self._rows: list[bytes] = []
        self._rows_bytes = 0
        self._health: list[bytes] = []
        self._batch_no = 0
        self._unacked: dict[int, tuple[float, dict]] = {}
        self._greenlet = gevent.spawn(self._ship_loop)
        self._closed = False

    # ---- producing ------------------------------------------------------------------------
    def next_seq(self) -> int:
        seq = self.started
        self.started += 1
        self.spool.started(seq)
        return seq

    def record(self, row: RequestRow) -> None:
        line = orjson.dumps(row) + b"\n"
        self.spool.request(line)
        self.produced += 1
        self._rows.append(line)
        self._rows_bytes += len(line)
        if self._rows_bytes >= MAX_BATCH_BYTES:
            self.ship()

    def record_health(self, row: HealthRow) -> None:
        line = orjson.dumps(row) + b"\n"
        self.spool.health(line)
        self._health.append(line)

    # ---- shipping -------------------------------------------------------------------------
    def ship(self) -> None:
        if not (self._rows or self._health):
            return
        self._batch_no += 1
        batch = {"run_id": self.run_id, "worker": self.worker, "batch": self._batch_no,
                 "rows": b"".join(self._rows), "n_rows": len(self._rows),
                 "health": b"".join(self._health), "started": self.started,
                 "produced": self.produced}
        self._rows, self._rows_bytes, self._health = [], 0, []
        self._unacked[self._batch_no] = (time.monotonic(), batch)
        self._send(batch)

    def _send(self, batch: dict) -> None:
        try:
            self.runner.send_message(messages.ROWS, batch)
        except Exception as exc:  # noqa: BLE001 - kept in the spool and sent again later
            log.warning("servelab: batch %d not sent to the master (%s); will retry",
                        batch["batch"], exc)

    def acked(self, batch_no: int) -> None:
        self._unacked.pop(batch_no, None)

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    def _resend_overdue(self) -> None:
        now = time.monotonic()
        for no, (sent, batch) in list(self._unacked.items()):
            if now - sent >= self.resend_after_s:
                self._unacked[no] = (now, batch)
                self._send(batch)

    def _ship_loop(self) -> None:
        while True:
            gevent.sleep(self.interval_s)
            self.ship()
            self._resend_overdue()

    def flush(self, timeout_s: float) -> bool:
        """Ship everything and wait until the master acknowledged it all (or time ran out)."""
        self.ship()
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while self._unacked and time.monotonic() < deadline:
            gevent.sleep(0.02)
            if time.monotonic() - last > 2.0:
                last = time.monotonic()
                for no, (_, batch) in list(self._unacked.items()):
                    self._unacked[no] = (last, batch)
                    self._send(batch)
        return not self._unacked

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._greenlet.kill(block=False)
            self.spool.close()
