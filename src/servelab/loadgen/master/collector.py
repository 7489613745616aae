"""Master side of a run: starts it, records its stages, stores the workers' rows, ends it.

Only this process opens the DuckDB file (``writer.DbWriter``, one OS thread). The end of a run
is servelab's, not Locust's: ``drain_and_finish`` tells every worker to stop sending, lets
in-flight requests finish (``--drain-timeout``), waits until each worker reports that the master
acknowledged all its rows, and only then writes the final record. Locust's own headless quit
gives workers half a second, which is not enough to ship a backlog.
"""
from __future__ import annotations

import logging
import os
import socket
import time

import gevent
from gevent.event import Event
from gevent.threadpool import ThreadPool

from servelab.core.timeouts import WORKERS_READY_S
from servelab.loadgen import messages
from servelab.loadgen.client.clock import now_unix
from servelab.loadgen.master.accounts import WorkerAccounts
from servelab.loadgen.master.endpoints import EndpointLog
from servelab.loadgen.master import live, spans_intake
from servelab.loadgen.master.run_record import RunRecord
from servelab.loadgen.master.scraper import Scraper, server_state
from servelab.loadgen.master.stages import StageRecords
from servelab.loadgen.master.status import StatusFile
from servelab.loadgen.master.writer import DbWriter
from servelab.loadgen.options import Settings, new_run_id

log = logging.getLogger("servelab.loadgen")
DRAIN_SLACK_S = 45.0   # past --drain-timeout: the workers' acks and their DRAINED reports
IDLE_WAIT_S = 30.0     # the writer storing what is queued


class Collector:
    """``open_db(path)``: how the writer opens the database (default: the store's own)."""

    def __init__(self, environment, open_db=None):
        from servelab.store.db import open_db as store_open_db

        self.env = environment
        self.open_db = open_db or store_open_db
        self.runner = environment.runner
        self.pool = ThreadPool(1)
        self.active = False
        self.draining = False
        self.run_id: str | None = None
        self.settings: Settings | None = None
        self.record: RunRecord | None = None
        self.accounts = WorkerAccounts([])
        self.stages = StageRecords("")
        self.live = live.LiveWindow()
        self.writer: DbWriter | None = None
        self.scraper: Scraper | None = None
        self.endpoints = EndpointLog("")   # what /metrics and /v1/models answered
        self.status_file: StatusFile | None = None
        self.spans = spans_intake.attach(self, environment)   # finish(): waits for the last spans
        self.plan_stages: list = []     # the shape's stage plan, for the progress display
        self.worker_errors: list[str] = []
        self.flags: list[str] = []
        self.notes: list[str] = []
        self._ready_nodes: set[str] = set()
        self._used_run_ids: set[str] = set()
        self._finished = Event()

    # ---- run lifecycle --------------------------------------------------------------------
    def start_run(self, settings: Settings, profile, shaped: bool) -> None:
        run_id = settings.run_id if settings.run_id and settings.run_id not in \
            self._used_run_ids else new_run_id()
        self._used_run_ids.add(run_id)
        self.run_id = run_id
        self.settings = settings
        target = (self.env.host or "").rstrip("/")
        self.accounts = WorkerAccounts(self._live_nodes_sorted())
        self.record = RunRecord(run_id, settings, profile, shaped, target,
                                0 if self.local else len(self.accounts.slots))
        self.stages = StageRecords(run_id)
        self.worker_errors = []
        self.flags, self.notes = [], []
        self._ready_nodes = set()
        self._finished.clear()
        self.draining = False
        self.writer = DbWriter(self.pool, self.open_db, settings.db, run_id, self.accounts,
                               self._ack)
        self.live = live.for_run(self, profile)   # on the writer's stored rows
        self.active = True
        record = self.record

        def insert_run(store) -> None:
            store.append_rows("runs", [record.row("running")], replace=True)
            store.append_rows("run_classes", record.class_rows(), replace=True)

        self.writer.call(insert_run)
        self.endpoints = EndpointLog(run_id, self.writer.call)
        if record.model_problem is not None:
            p = record.model_problem
            self.endpoints.record(p.endpoint, p.outcome, p.detail, record.started_unix,
                                  instead="The requests went without a model name")
        # The master's pid and host: a worker on this host stops within a second of its death.
        self.runner.send_message(messages.RUN, dict(record.announcement(self.accounts.slots),
                                                    master_pid=os.getpid(),
                                                    master_host=socket.gethostname()))
        self.scraper = Scraper(target, self._on_scrape, events=self.endpoints) \
            if target else None
        if self.scraper is not None:
            self.writer.on_scrape_error = self.scraper.parse_failed   # called in the db thread
        self.status_file = StatusFile(settings.status_file, self.status)
        self.live.start_ticks()
        log.info("servelab: run %s started: profile %s, %d worker(s), target %s", run_id,
                 profile.name, len(self.accounts.slots), target)

    def _live_nodes(self) -> set[str] | None:
        clients = getattr(self.runner, "clients", None)
        if clients is None:
            return None
        return {c.id for c in clients.all if c.state != "missing"}

    def _live_nodes_sorted(self) -> list[str]:
        return sorted(self._live_nodes() or ()) or ["local"]

    @property
    def worker_count(self) -> int:
        return len(self.accounts.slots)

    @property
    def local(self) -> bool:
        return getattr(self.runner, "clients", None) is None

    # ---- stages ---------------------------------------------------------------------------
    def stage_begin(self, stage: messages.StageMessage) -> None:
        """A stage began, or its description changed (reached, measured window set or cut)."""
        stage, row = self.stages.begin(stage)
        self._write_stage(row)
        if not stage.open_loop:  # closed loop: workers stamp rows with it
            self.runner.send_message(messages.STAGE, stage.to_message())

    def stage_end(self, index: int, t_unix: float) -> None:
        row = self.stages.end(index, t_unix)
        if row is not None:
            self._write_stage(row)

    def _write_stage(self, row) -> None:
        self.writer.call(lambda store: store.append_rows("stages", [row], replace=True))

    def announce_open_stages(self, stages: list[messages.StageMessage]) -> None:
        self.runner.send_message(messages.OPEN_STAGES, {
            "run_id": self.run_id, "stages": [st.to_message() for st in stages]})

    # ---- incoming messages ----------------------------------------------------------------
    def on_rows(self, node_id: str, data: dict) -> None:
        if not self.active or data.get("run_id") != self.run_id:
            return
        acct = self.accounts.get(data["worker"])
        if acct is None:
            log.warning("servelab: rows from unknown worker %s ignored", data["worker"])
            return
        acct.node_id = node_id
        acct.counts(data)
        self.live.add_batch(data)
        self.writer.batch(node_id, data)

    def on_ready(self, node_id: str, data: dict) -> None:
        if data.get("run_id") != self.run_id:
            return
        self._ready_nodes.add(node_id)
        if data.get("error"):
            self.worker_errors.append(data["error"])
            log.error("servelab: a worker could not join the run: %s", data["error"])

    def wait_ready(self, timeout_s: float = WORKERS_READY_S) -> None:
        """Until every worker has built its run context (or reported that it could not)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = self._live_nodes()
            want = set(self.accounts.slots)
            if live is not None:
                want &= live
            if want <= self._ready_nodes:
                return
            gevent.sleep(0.02)
        log.warning("servelab: not every worker reported ready within %.0f s", timeout_s)

    def on_drained(self, node_id: str, data: dict) -> None:
        if data.get("run_id") == self.run_id:
            self.accounts.drained(data)
            self.endpoints.record_all(data.get("endpoint_events") or ())

    def _ack(self, node_id: str, worker: str, batch_no: int) -> None:
        try:
            self.runner.send_message(messages.ACK, {"run_id": self.run_id, "worker": worker,
                                                    "batch": batch_no}, client_id=node_id)
        except Exception as exc:  # noqa: BLE001 - the worker resends and gets a fresh ack
            log.warning("servelab: ack to %s failed: %s", worker, exc)

    def _on_scrape(self, t_unix: float, text: str) -> None:
        if self.active:
            self.writer.metrics(t_unix, text)
            self.live.add_scrape(t_unix, server_state(text))

    # ---- the end --------------------------------------------------------------------------
    def drain_and_finish(self, status: str) -> None:
        if not self.active:
            return
        if self.draining:
            self._finished.wait()
            return
        self.draining = True
        try:
            self._drain()
        finally:
            self._finish(status)

    def _drain(self) -> None:
        timeout_s = self.settings.drain_timeout_s
        self.writer.hurry()
        self.runner.send_message(messages.DRAIN, {"run_id": self.run_id, "timeout_s": timeout_s})
        deadline = time.monotonic() + timeout_s + DRAIN_SLACK_S
        while time.monotonic() < deadline and self.accounts.undrained(self._live_nodes()):
            gevent.sleep(0.05)
        self.writer.wait_idle(IDLE_WAIT_S)

    def _finish(self, status: str) -> None:
        from servelab.store import runs as run_record

        if self.scraper is not None:
            self.scraper.stop()
        self.live.stop_ticks()
        writer = self.writer
        writer.wait_idle(IDLE_WAIT_S)
        if self.scraper is not None:   # the last pages' parse reports, then their rows
            self.scraper.flush()
            writer.wait_idle(IDLE_WAIT_S)
        workers, notes, sources = self.accounts.settle(self.run_id, self.settings.spool_dir)
        notes += writer.notes() + [f"a worker could not join the run: {err}" for err in
                                   self.worker_errors] + self.endpoints.notes() + self.spans.finish()
        extra = {"token_count_source": ",".join(sorted(sources)) or None,
                 "metrics_scrape": self.scraper.status if self.scraper else None}
        final_row = self.record.row(status, "; ".join(notes) or None, extra)

        def final(store) -> list[str]:
            store.append_rows("run_workers", workers, replace=True)
            store.append_rows("runs", [final_row], replace=True)
            return run_record.finish(store.con, self.run_id)

        self.flags = []
        try:
            self.flags = writer.run_now(final)
        except Exception as exc:  # noqa: BLE001
            log.error("servelab: writing the final record failed: %s", exc)
            notes.append(f"final record failed: {exc}")
        self.notes = notes
        self.status_file.stop()
        self.live.finish()
        self.status_file.write(state=status, flags=self.flags, notes=self.notes)
        try:
            writer.close()
        finally:
            self.active = False
            self._finished.set()
        _log_end(self.run_id, status, self.flags, notes)

    def close(self) -> None:
        if self.active:
            self.drain_and_finish("interrupted")
        self.pool.kill()

    # ---- live status ----------------------------------------------------------------------
    def status(self) -> dict:
        st = self.stages.current
        return {
            "run_id": self.run_id, "pid": os.getpid(), "t_unix": now_unix(),
            "elapsed_s": time.time() - self.record.started_unix,
            **status_stage(st), "stages": len(self.plan_stages),
            "users": getattr(self.runner, "user_count", None),
            "produced": self.accounts.produced(), "stored": self.accounts.stored(),
            "errors": self.live.errors, **self.live.headline(),
            "workers": {a.worker: {"produced": a.produced, "stored": a.stored, "lost": a.lost}
                        for a in self.accounts.all()},
            "state": "draining" if self.draining else "running",
        }

    def live_view(self, since: float | None = None) -> dict:
        """The LLM tab's data: ``live.view_of`` (``since``: only the newer series points)."""
        return live.view_of(self, since)


def status_stage(st: messages.StageMessage | None) -> dict:
    """The status file's current-stage keys (orchestration.progress reads them back)."""
    if st is None:
        return {"stage": None, "stage_kind": None, "level": None, "stage_started_unix": None}
    return {"stage": st.stage, "stage_kind": st.kind, "level": st.level,
            "stage_started_unix": st.started_unix}


def _log_end(run_id: str, status: str, flags: list[str], notes: list[str]) -> None:
    log.info("servelab: run %s %s; flags: %s", run_id, status, ", ".join(flags) or "none")
    for note in notes:
        log.warning("servelab: %s", note)
