"""Master side of a run: the run record, stages, storing the workers' rows, acks, loss accounting.

Only this process opens the DuckDB file. All database work happens in one real OS thread (a
gevent ThreadPool of size 1): the event loop only queues work and waits cooperatively, so a
large insert never stalls Locust's heartbeats or message handling. Incoming row batches are
stored in one transaction per wake-up, then acknowledged to their worker; a batch number seen
before is acknowledged again and not stored twice.

The end of a run is servelab's, not Locust's: ``drain_and_finish`` tells every worker to stop
sending, lets in-flight requests finish (``--drain-timeout``), waits until each worker reports
that the master acknowledged all its rows, and only then writes the final record. Locust's own
headless quit gives workers half a second, which is not enough to ship a backlog.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import secrets
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import gevent
from gevent.event import Event
from gevent.queue import Queue
from gevent.threadpool import ThreadPool

from servelab import __version__
from servelab.loadgen.clock import now_unix
from servelab.loadgen.options import Settings, new_run_id
from servelab.loadgen.scraper import Scraper, metric_rows

log = logging.getLogger("servelab.loadgen")

RUN_MESSAGE = "servelab_run"
STAGE_MESSAGE = "servelab_stage"
OPEN_STAGES_MESSAGE = "servelab_open_stages"
DRAIN_MESSAGE = "servelab_drain"
ACK_MESSAGE = "servelab_ack"
LIVE_WINDOW_S = 10.0


@dataclass
class WorkerAccount:
    worker: str
    node_id: str
    slot: int
    host: str | None = None
    started: int = 0
    produced: int = 0
    stored: int = 0
    batches: int = 0
    drained: dict | None = None
    spool_path: str | None = None
    lost: bool = False
    stored_batches: set = field(default_factory=set)


class Collector:
    def __init__(self, environment):
        self.env = environment
        self.runner = environment.runner
        self.pool = ThreadPool(1)
        self.active = False
        self.run_id: str | None = None
        self._used_run_ids: set[str] = set()
        self._finished = Event()
        self._draining = False
        self.plan_stages: list = []     # the shape's stage plan, for the progress display

    # ---- run lifecycle --------------------------------------------------------------------
    def start_run(self, settings: Settings, profile, shaped: bool) -> None:
        from servelab.profiles.tokens import resolve_model

        self.settings = settings
        self.profile = profile
        self.shaped = shaped
        self.run_id = settings.run_id if settings.run_id and settings.run_id not in \
            self._used_run_ids else new_run_id()
        self._used_run_ids.add(self.run_id)
        self.started_unix = time.time()
        self.target = (self.env.host or "").rstrip("/")
        model = settings.served_model or (profile.model if profile.model != "auto" else None)
        if model is None:
            try:
                model = resolve_model(self.target, 5.0)
            except Exception as exc:  # noqa: BLE001 - requests will show what the server says
                log.warning("servelab: could not read %s/v1/models (%s); sending no model name",
                            self.target, exc)
        self.model = model
        self.salt = secrets.token_hex(3) if profile.salt else None
        self.seed = profile.seed if settings.seed is None else settings.seed
        nodes = self._worker_nodes()
        self.slots = {node: i for i, node in enumerate(nodes)}
        self.accounts = {f"w{i}": WorkerAccount(f"w{i}", node, i) for node, i in
                         self.slots.items()}
        self._by_node = {a.node_id: a for a in self.accounts.values()}
        self.queue: Queue = Queue()
        self._pending = 0
        self._idle = Event()
        self._idle.set()
        self._live: deque = deque()
        self.errors = 0
        self.stages: dict[int, dict] = {}
        self.current_stage: dict | None = None
        self._stage_version = 0
        self.db_error: str | None = None
        self._ready_nodes: set[str] = set()
        self.worker_errors: list[str] = []
        self._finished.clear()
        self._draining = False
        self.host_info = self._host_info()
        self.gpus = self._variant_gpus(settings.variant)
        self.profile_text = profile.path.read_text(encoding="utf-8")
        self.pool.apply(self._open_db)       # raises DatabaseLocked before anything is sent
        self.active = True
        self._writer = gevent.spawn(self._writer_loop)
        self._enqueue(("call", self._insert_run))
        run = {"run_id": self.run_id, "slots": self.slots, "settings": settings.as_json(),
               "profile_path": str(profile.path), "profile_text": self.profile_text,
               "seed": self.seed, "salt": self.salt, "model": self.model,
               "target": self.target}
        self.runner.send_message(RUN_MESSAGE, run)
        self.scraper = Scraper(self.target, self._on_scrape) if self.target else None
        self._status_greenlet = gevent.spawn(self._status_loop)
        log.info("servelab: run %s started: profile %s, %d worker(s), target %s", self.run_id,
                 profile.name, len(self.slots), self.target)

    def _worker_nodes(self) -> list[str]:
        clients = getattr(self.runner, "clients", None)
        if clients is None:
            return ["local"]
        nodes = [c.id for c in clients.all if c.state != "missing"]
        return sorted(nodes) or ["local"]

    @property
    def worker_count(self) -> int:
        return len(self.slots)

    @property
    def local(self) -> bool:
        return getattr(self.runner, "clients", None) is None

    # ---- stages ---------------------------------------------------------------------------
    def stage_begin(self, stage: dict) -> None:
        self._stage_version += 1
        stage = dict(stage, version=self._stage_version)
        self.stages[stage["stage"]] = stage
        if self.current_stage is None or stage["stage"] >= self.current_stage["stage"]:
            self.current_stage = stage
        self._enqueue(("call", lambda store: self._write_stage(store, stage)))
        if stage.get("start_unix") is None:  # closed loop: workers stamp rows with it
            self.runner.send_message(STAGE_MESSAGE, stage)

    def stage_update(self, stage: dict) -> None:
        self.stage_begin(stage)

    def stage_end(self, index: int, t_unix: float) -> None:
        stage = self.stages.get(index)
        if stage is None or stage.get("ended_unix") is not None:
            return
        stage = dict(stage, ended_unix=t_unix)
        self.stages[index] = stage
        self._enqueue(("call", lambda store: self._write_stage(store, stage)))

    def announce_open_stages(self, stages: list[dict]) -> None:
        self.runner.send_message(OPEN_STAGES_MESSAGE, {"run_id": self.run_id, "stages": stages})

    def _write_stage(self, store, stage: dict) -> None:
        row = {k: stage.get(k) for k in ("stage", "kind", "level", "started_unix",
                                         "reached_unix", "measure_start_unix",
                                         "measure_end_unix", "ended_unix")}
        row["run_id"] = self.run_id
        store.append_rows("stages", [row], replace=True)

    # ---- incoming messages ----------------------------------------------------------------
    def on_rows(self, node_id: str, data: dict) -> None:
        if not self.active or data.get("run_id") != self.run_id:
            return
        acct = self.accounts.get(data["worker"])
        if acct is None:
            log.warning("servelab: rows from unknown worker %s ignored", data["worker"])
            return
        acct.node_id = node_id
        acct.started = max(acct.started, data["started"])
        acct.produced = max(acct.produced, data["produced"])
        now = time.monotonic()
        for ttft, itl, ok in data.get("live", ()):
            self._live.append((now, ttft, itl, ok))
            if not ok:
                self.errors += 1
        self._enqueue(("batch", node_id, data))

    def on_ready(self, node_id: str, data: dict) -> None:
        if data.get("run_id") != self.run_id:
            return
        self._ready_nodes.add(node_id)
        if data.get("error"):
            self.worker_errors.append(data["error"])
            log.error("servelab: a worker could not join the run: %s", data["error"])

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until every worker has built its run context (or reported that it could not)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = self._live_nodes()
            want = set(self.slots) if live is None else set(self.slots) & live
            if want <= self._ready_nodes:
                return
            gevent.sleep(0.02)
        log.warning("servelab: not every worker reported ready within %.0f s", timeout_s)

    def on_drained(self, node_id: str, data: dict) -> None:
        acct = self.accounts.get(data.get("worker"))
        if acct is not None and data.get("run_id") == self.run_id:
            acct.drained = data
            acct.host = data.get("host")
            acct.spool_path = data.get("spool_path")
            acct.started = max(acct.started, data["started"])
            acct.produced = max(acct.produced, data["produced"])

    # ---- database thread ------------------------------------------------------------------
    def _enqueue(self, item) -> None:
        self._pending += 1
        self._idle.clear()
        self.queue.put(item)

    def _writer_loop(self) -> None:
        while True:
            items = [self.queue.get()]
            while not self.queue.empty() and len(items) < 500:
                items.append(self.queue.get_nowait())
            try:
                acks = self.pool.apply(self._write_items, (items,))
            except Exception as exc:  # noqa: BLE001 - rows stay spooled; workers resend
                self.db_error = f"{type(exc).__name__}: {exc}"
                log.error("servelab: storing a batch failed: %s", self.db_error)
                acks = []
            for node_id, acct, batch_no, n_rows, fresh in acks:
                if fresh:
                    acct.stored += n_rows
                    acct.batches += 1
                self._ack(node_id, acct.worker, batch_no)
            self._pending -= len(items)
            if self._pending == 0:
                self._idle.set()

    def _ack(self, node_id: str, worker: str, batch_no: int) -> None:
        try:
            self.runner.send_message(ACK_MESSAGE, {"run_id": self.run_id, "worker": worker,
                                                   "batch": batch_no}, client_id=node_id)
        except Exception as exc:  # noqa: BLE001 - the worker resends and gets a fresh ack
            log.warning("servelab: ack to %s failed: %s", worker, exc)

    def _open_db(self) -> None:
        from servelab.analysis.views import open_results_db
        from servelab.store.db import Store

        self.store = Store(open_results_db(self.settings.db), threads=1)

    def _write_items(self, items: list) -> list:
        store = self.store
        con = store.con
        rows, health, metrics, calls, acks = [], [], [], [], []
        for item in items:
            if item[0] == "batch":
                _, node_id, data = item
                acct = self.accounts[data["worker"]]
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
            store.append_ndjson("requests", b"".join(rows))
            store.append_ndjson("client_health", b"".join(health))
            store.append_ndjson("server_metrics", b"".join(metrics))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            for _, acct, key, _, fresh in acks:
                if fresh:
                    acct.stored_batches.discard(key)
            raise
        return acks

    def _insert_run(self, store) -> None:
        p = self.profile
        store.append_rows("runs", [self._run_row("running", [])], replace=True)
        store.append_rows("run_classes", [{
            "run_id": self.run_id, "class_name": c.name, "weight": c.weight,
            "slo_ttft_ms": c.slo.ttft_ms, "slo_tpot_ms": c.slo.tpot_ms,
            "slo_itl_ms": c.slo.itl_ms, "slo_e2e_ms": c.slo.e2e_ms} for c in p.classes],
            replace=True)

    def _host_info(self) -> dict:
        # Read once on the event loop: platform.platform() may start a subprocess, which gevent
        # only allows there, not in the database thread.
        import duckdb
        import locust

        return {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                "python": sys.version.split()[0], "platform": platform.platform(),
                "locust": locust.__version__, "duckdb": duckdb.__version__}

    def _run_row(self, status: str, flags: list, notes: str | None = None,
                 extra_settings: dict | None = None) -> dict:
        p = self.profile
        s = self.settings
        settings = dict(s.as_json(), seed=self.seed, salt=self.salt, shaped=self.shaped)
        settings.update(extra_settings or {})
        return {
            "run_id": self.run_id, "started_unix": self.started_unix,
            "finished_unix": time.time() if status != "running" else None,
            "profile_name": p.name, "profile_path": str(p.path),
            "profile_text": self.profile_text, "load_kind": p.load.kind,
            "target": self.target, "variant": s.variant or None,
            "hardware": s.hardware or None, "model": self.model, "gpus": self.gpus,
            "tags": s.tags, "servelab_version": __version__,
            "workers": 0 if self.local else len(self.slots), "status": status,
            "host_info": self.host_info,
            "flags": flags, "settings": settings, "notes": notes,
        }

    @staticmethod
    def _variant_gpus(variant: str) -> int | None:
        if not variant:
            return None
        try:
            from servelab.specs.variants import load_variant

            return load_variant(variant).gpus
        except Exception:  # noqa: BLE001 - a variant name that is only a label
            return None

    def _on_scrape(self, t_unix: float, text: str) -> None:
        if self.active:
            self._enqueue(("metrics", t_unix, text))

    # ---- the end --------------------------------------------------------------------------
    def drain_and_finish(self, status: str) -> None:
        if not self.active:
            return
        if self._draining:
            self._finished.wait()
            return
        self._draining = True
        try:
            self._drain()
        finally:
            self._finish(status)

    def _live_nodes(self) -> set[str] | None:
        clients = getattr(self.runner, "clients", None)
        if clients is None:
            return None
        return {c.id for c in clients.all if c.state != "missing"}

    def _drain(self) -> None:
        s = self.settings
        self.runner.send_message(DRAIN_MESSAGE, {"run_id": self.run_id,
                                                 "timeout_s": s.drain_timeout_s})
        deadline = time.monotonic() + s.drain_timeout_s + 45.0
        while time.monotonic() < deadline:
            live = self._live_nodes()
            waiting = [a for a in self.accounts.values() if a.drained is None
                       and (live is None or a.node_id in live)]
            if not waiting:
                break
            gevent.sleep(0.05)
        self._idle.wait(30.0)

    def _finish(self, status: str) -> None:
        from servelab.store import runs as run_record
        from servelab.store.spool import read_spool

        if self.scraper is not None:
            self.scraper.stop()
        self._idle.wait(30.0)
        notes = []
        sources = set()
        workers = []
        for a in self.accounts.values():
            in_flight_lost = 0
            state = "finished"
            if a.drained is None:
                a.lost = True
                state = "lost"
                a.spool_path = a.spool_path or str(
                    (Path(self.settings.spool_dir) / self.run_id / a.worker).resolve())
                exact = None
                try:
                    exact = read_spool(a.spool_path)
                except (OSError, ValueError, KeyError):
                    pass
                if exact is not None and exact.meta.get("run_id") == self.run_id:
                    a.produced = max(a.produced, len(exact.seqs))
                    in_flight_lost = exact.in_flight_lost
                    a.host = a.host or exact.meta.get("host")
                    notes.append(f"worker {a.worker} was lost: {a.produced} rows produced, "
                                 f"{a.stored} stored, {a.produced - a.stored} left in its spool "
                                 f"{a.spool_path} (load them with `servelab ingest "
                                 f"{a.spool_path}`), {in_flight_lost} requests in flight lost")
                else:
                    in_flight_lost = max(0, a.started - a.produced)
                    notes.append(f"worker {a.worker} was lost: at its last report {a.produced} "
                                 f"rows produced and {in_flight_lost} in flight; {a.stored} "
                                 "stored; its spool is on its own host")
            else:
                if a.drained.get("count_source"):
                    sources.add(a.drained["count_source"])
                if a.drained.get("aborted"):
                    notes.append(f"worker {a.worker}: {a.drained['aborted']} requests were still "
                                 "in flight at the drain deadline and were recorded as aborted")
                if not a.drained.get("all_acked"):
                    notes.append(f"worker {a.worker}: not every batch was acknowledged")
            workers.append({"run_id": self.run_id, "worker": a.worker, "host": a.host,
                            "produced": a.produced, "stored": a.stored,
                            "in_flight_lost": in_flight_lost, "status": state,
                            "spool_path": a.spool_path})
        if self.db_error:
            notes.append(f"database error during the run: {self.db_error}")
        for err in self.worker_errors:
            notes.append(f"a worker could not join the run: {err}")
        extra = {"token_count_source": ",".join(sorted(sources)) or None,
                 "metrics_scrape": self.scraper.status if self.scraper else None}

        def final(store):
            store.append_rows("run_workers", workers, replace=True)
            store.append_rows("runs", [self._run_row(status, [], "; ".join(notes) or None,
                                                     extra)], replace=True)
            self.flags = run_record.finish(store.con, self.run_id)
            self.saturation = run_record.saturation(store.con, self.run_id)

        self.flags, self.saturation = [], []
        try:
            self.pool.apply(final, (self.store,))
        except Exception as exc:  # noqa: BLE001
            log.error("servelab: writing the final run record failed: %s", exc)
            notes.append(f"final record failed: {exc}")
        self.notes = notes
        self._write_status(final=True, status=status)
        self._writer.kill(block=False)
        self._status_greenlet.kill(block=False)
        try:
            self.pool.apply(self.store.close)
        finally:
            self.active = False
            self._finished.set()
        log.info("servelab: run %s %s; flags: %s", self.run_id, status,
                 ", ".join(self.flags) or "none")
        for note in notes:
            log.warning("servelab: %s", note)

    def close(self) -> None:
        if self.active:
            self.drain_and_finish("interrupted")
        self.pool.kill()

    # ---- live status ----------------------------------------------------------------------
    def status(self) -> dict:
        now = time.monotonic()
        live = self._live
        while live and now - live[0][0] > LIVE_WINDOW_S:
            live.popleft()
        ttft = sorted(x[1] for x in live if x[3] and x[1] is not None)
        itl = sorted(x[2] for x in live if x[3] and x[2] is not None)
        st = self.current_stage or {}
        return {
            "run_id": self.run_id, "pid": os.getpid(), "t_unix": now_unix(),
            "elapsed_s": time.time() - self.started_unix,
            "stage": st.get("stage"), "stages": len(self.plan_stages),
            "stage_kind": st.get("kind"), "level": st.get("level"),
            "stage_started_unix": st.get("started_unix"),
            "users": getattr(self.runner, "user_count", None),
            "produced": sum(a.produced for a in self.accounts.values()),
            "stored": sum(a.stored for a in self.accounts.values()),
            "errors": self.errors,
            "ttft_p50_ms": _pct(ttft, 0.5), "ttft_p99_ms": _pct(ttft, 0.99),
            "itl_p50_ms": _pct(itl, 0.5), "itl_p99_ms": _pct(itl, 0.99),
            "workers": {a.worker: {"produced": a.produced, "stored": a.stored,
                                   "lost": a.lost} for a in self.accounts.values()},
        }

    def _write_status(self, final: bool = False, status: str = "running") -> None:
        path = self.settings.status_file
        if not path:
            return
        data = self.status()
        data["state"] = status if final else ("draining" if self._draining else "running")
        if final:
            data["flags"] = getattr(self, "flags", [])
            data["notes"] = getattr(self, "notes", [])
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)

    def _status_loop(self) -> None:
        while True:
            try:
                self._write_status()
            except OSError as exc:
                log.warning("servelab: status file: %s", exc)
            gevent.sleep(1.0)


def _pct(values: list, q: float):
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]
