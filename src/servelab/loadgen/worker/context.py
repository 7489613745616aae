"""Worker side of a run: what one load-generating process needs to send and record requests.

The master announces a run with ``servelab_run`` (run id, this worker's slot among the workers,
the profile text, the prompt salt, the model) before Locust spawns any user. Each process then
holds one ``WorkerContext``: the profile's planner and prompt builder, the target, the watchdog,
the recorder (spool + shipping), the health monitor and the current stage.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import gevent
from gevent.event import Event

from servelab.core.errors import ServelabError
from servelab.loadgen.client.clock import now_unix, to_unix
from servelab.loadgen.client.request import ALL_STATUSES, RequestSpec, Target, execute
from servelab.loadgen.client.watchdog import StreamTimeout, Watchdog
from servelab.loadgen.messages import StageMessage
from servelab.loadgen.options import Settings
from servelab.loadgen.worker.health import HealthMonitor
from servelab.loadgen.worker.openloop import OpenLoopStage
from servelab.loadgen.worker.recorder import Recorder
from servelab.store.rows import dropped_arrival
from servelab.store.spool import Spool

log = logging.getLogger("servelab.loadgen")
ACK_TIMEOUT_S = 30.0   # the master acknowledging a worker's last batches at the drain

_current: "WorkerContext | None" = None
_ready = Event()


def current(timeout: float | None = 60.0) -> "WorkerContext | None":
    """The context of the run in progress; waits for it while the run is being set up."""
    _ready.wait(timeout)
    return _current


def current_now() -> "WorkerContext | None":
    """The context if it is built and installed, without waiting."""
    return _current if _ready.is_set() else None


def install(ctx: "WorkerContext | None") -> None:
    global _current
    old, _current = _current, ctx
    if old is not None and old is not ctx:
        old.close()
    if ctx is None:
        _ready.clear()
    else:
        _ready.set()


def load_shipped_profile(run: dict, spool_root: str):
    """The profile as the master read it: its own file when it and every file it names are
    identical here, else a copy rebuilt from the RUN message (``loadgen/profile_files.py``)."""
    from servelab.loadgen import profile_files
    from servelab.profiles import load_profile

    path, text = Path(run["profile_path"]), run["profile_text"]
    sent = run.get("profile_files") or {}
    shipped = sent.get("files") or {}
    if profile_files.same_here(path, text) and all(
            profile_files.same_here(path.parent / ref, body) for ref, body in shipped.items()):
        return load_profile(path)
    if sent.get("error"):   # over the size cap: nothing came, and nothing is here
        raise ServelabError(sent["error"])
    root = Path(spool_root) / run["run_id"] / "profile"
    return load_profile(profile_files.unpack(root, path.name, text, shipped))


class WorkerContext:
    """``report`` is Locust's request event (``users.report_request``), handed to the client."""

    def __init__(self, environment, settings: Settings, run: dict, report=None):
        from servelab.profiles.planner import RequestPlanner
        from servelab.profiles.prompts import PromptBuilder
        from servelab.profiles.tokens import make_counter

        self.environment = environment
        self.report = report
        self.settings = settings
        self.run = run
        self.run_id = run["run_id"]
        slots = run["slots"]
        client_id = getattr(environment.runner, "client_id", "local")
        self.slot = slots.get(client_id, 0) if len(slots) > 1 else 0
        self.slots = max(1, len(slots))
        self.worker = f"w{self.slot}"
        self.host = socket.gethostname()
        self.profile = load_shipped_profile(run, settings.spool_dir)
        self.chat = self.profile.endpoint == "chat"
        self.planner = RequestPlanner(self.profile, run["seed"])
        self.stages = {s.index: s for s in self.planner.stages()}
        base_url = environment.host or run["target"]
        counter = make_counter(base_url, run["model"], settings.tokenizer or
                               self.profile.tokenizer_path)
        self.count_source = counter.source
        self.counter = counter
        self.builder = PromptBuilder(self.profile, counter, salt=run["salt"], seed=run["seed"])
        self.target = Target(base_url, self.chat, run["model"], run.get("request_id_field"))
        self.watchdog = Watchdog(settings.timeouts)
        spool = Spool(settings.spool_dir, self.run_id, self.worker)
        self.spool_path = str(spool.dir.resolve())
        self.recorder = Recorder(environment.runner, self.run_id, self.worker, spool)
        self.sessions = self.planner.sessions(self.slot, self.slots)
        self.stage: StageMessage | None = None
        self.stage_event = Event()
        self.draining = False
        self.drained = Event()
        self._busy = 0
        self.open_loops: dict[int, object] = {}
        self._open_pending: list[dict] = []
        self._open_seen: set[int] = set()
        self._open_event = Event()
        self.health = HealthMonitor(self.run_id, self.worker, self.recorder,
                                    self.watchdog.in_flight, self.backlog)

    # ---- stages ---------------------------------------------------------------------------
    def set_stage(self, message: "dict | StageMessage") -> None:
        """A STAGE message: the current closed-loop stage (rows are stamped with it)."""
        stage = StageMessage.from_message(message)
        cur = self.stage
        if cur is not None and (cur.stage, cur.version) > (stage.stage, stage.version):
            return  # an update of an earlier stage, or one overtaken by a newer one
        if cur is None:
            self.health.reset()
        self.stage = stage
        self.stage_event.set()
        self.stage_event.clear()

    def announce_open_stages(self, messages: list) -> None:
        stages = [StageMessage.from_message(m) for m in messages]   # OPEN_STAGES' list
        last = max(st.stage for st in stages)
        for st in sorted(stages, key=lambda st: st.start_unix):
            if st.stage not in self._open_seen:
                self._open_seen.add(st.stage)
                loop = OpenLoopStage(self, st, final=st.stage == last)
                self.open_loops[st.stage] = loop
                self._open_pending.append(loop)
        self.health.reset()
        self._open_event.set()

    def next_open_stage(self):
        """The next announced open-loop stage for this worker's dispatcher (None: none yet)."""
        if not self._open_pending:
            self._open_event.clear()
            self._open_event.wait(1.0)
        if self.draining or not self._open_pending:
            if self.draining:
                self.drained.wait()
            return None
        return self._open_pending.pop(0)

    def backlog(self) -> int:
        return sum(o.backlog() for o in self.open_loops.values())

    # ---- one request ----------------------------------------------------------------------
    def run_request(self, client, planned, built, stage: StageMessage, scheduled_perf=None,
                    collect_text: bool = False, late_ms: float | None = None):
        """Send one planned request, record its row; returns (outcome, reply text or None).

        After the drain has reported this worker's rows, nothing more is sent: (None, None)."""
        if self.drained.is_set():
            return None, None
        seq = self.recorder.next_seq()
        body = built.payload(self.target.model)
        spec = RequestSpec(f"{self.run_id}-{self.worker}-{seq}", planned.class_name, body,
                           built.prompt_tokens, built.counted_prompt_tokens,
                           planned.output_tokens)
        texts = [] if collect_text else None
        out = execute(client, self.target, spec, self.watchdog, texts, self.report)
        row = out.row
        row.run_id = self.run_id
        row.request_id = spec.request_id
        row.worker = self.worker
        row.worker_seq = seq
        row.plan(planned, stage.stage, stage.level)
        row.prompt_tokens_target = spec.prompt_tokens_target   # what was built, as sent
        row.warmup = stage.in_warmup(row.sent_unix)
        if scheduled_perf is not None:
            row.scheduled_unix = to_unix(scheduled_perf)
            lag_ms = (out.t_sent - scheduled_perf) * 1000.0
            row.arrival_status = "late" if lag_ms > (late_ms or 0.0) else "on_time"
        self.recorder.record(row)
        if out.aborted is not None:
            raise out.aborted
        return out, ("".join(texts) if texts is not None else None)

    def record_dropped(self, planned, stage: StageMessage, scheduled_perf, why: str) -> None:
        seq = self.recorder.next_seq()
        scheduled = to_unix(scheduled_perf)
        self.recorder.record(dropped_arrival(
            self.run_id, f"{self.run_id}-{self.worker}-{seq}", self.worker, seq, planned,
            stage.stage, stage.level, stage.in_warmup(scheduled), scheduled,
            now_unix(), why))

    # ---- closed loop ----------------------------------------------------------------------
    def closed_loop_item(self, client):
        """One user's next item: a single request or a whole session, turns in order. Returns
        the last request's row (None: nothing was sent), for the user's back-off."""
        if self.draining or self.stage is None:
            self._park()
            return None
        try:
            item = next(self.sessions)
        except StopIteration:
            self._park()
            return None
        history = None
        row = None
        for planned in item:
            if planned.turn > 1 and planned.think_time_s > 0:
                gevent.sleep(planned.think_time_s)
            with self.busy():
                if self.draining:
                    return row  # checked after the think time too: the run may have ended
                built = self.builder.build(planned, history)
                more = planned.turn < planned.turns
                out, reply = self.run_request(client, planned, built, self.stage,
                                              collect_text=more)
            if out is None:
                return row  # the run is over
            row = out.row
            if row.error_kind is not None:
                return row  # a conversation cannot go on past a failed turn
            if more:
                history = built.history_with(reply)
        return row

    @contextmanager
    def busy(self):
        """A turn being prepared or sent: the drain waits for it (a prompt build may yield)."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def _park(self) -> None:
        # Nothing to do (before the first stage, while draining): wait without spinning.
        if self.draining:
            self.drained.wait()
            gevent.sleep(1.0)
        else:
            self.stage_event.wait(1.0)

    # ---- end of the run -------------------------------------------------------------------
    def drain(self, timeout_s: float, ack_timeout_s: float = ACK_TIMEOUT_S) -> dict:
        """Stop sending, let in-flight requests finish, ship everything, wait for the acks."""
        self.draining = True
        self._open_event.set()
        deadline = time.monotonic() + timeout_s
        # Open loop: arrivals already due still get their slot; then in-flight requests finish.
        while time.monotonic() < deadline and (
                self.watchdog.in_flight() or self._busy
                or any(o.dispatching() for o in self.open_loops.values())):
            gevent.sleep(0.05)
        for loop in list(self.open_loops.values()):
            loop.stop()
        aborted = self.watchdog.abort_all(
            StreamTimeout("aborted", f"still in flight {timeout_s:g} s after the run ended"))
        if aborted:
            gevent.sleep(0.2)  # the aborted requests record their rows
        for loop in list(self.open_loops.values()):
            loop.join(5.0)
        self.health.sample()
        acked = self.recorder.flush(ack_timeout_s)
        self.drained.set()
        return {"run_id": self.run_id, "worker": self.worker, "produced": self.recorder.produced,
                "started": self.recorder.started, "all_acked": acked, "aborted": aborted,
                "host": self.host, "spool_path": self.spool_path, "pid": os.getpid(),
                "count_source": self.count_source,
                # a /tokenize that failed mid-run: the master records it in endpoint_events
                "endpoint_events": list(getattr(self.counter, "events", []))}

    def leave(self, timeout_s: float, ack_timeout_s: float) -> dict | None:
        """This worker is stopping on its own (SIGTERM, SIGINT, its master gone): the drain the
        master would have asked for, with a short wait for acks (the master may be dead; the
        spool keeps every row either way). A drain already under way is waited for."""
        if self.drained.is_set():
            return None
        if self.draining:
            self.drained.wait(timeout_s + ack_timeout_s + 5.0)
            return None
        log.warning("servelab: worker %s is stopping: draining %d request(s) in flight",
                    self.worker, self.watchdog.in_flight())
        report = self.drain(timeout_s, ack_timeout_s)
        log.warning("servelab: worker %s drained: %d rows spooled, all acknowledged: %s",
                    self.worker, report["produced"], report["all_acked"])
        return report

    def master_gone(self) -> bool:
        """The master's process no longer exists (only knowable on the master's own host)."""
        pid, host = self.run.get("master_pid"), self.run.get("master_host")
        if not pid or host != self.host:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    def warm_up(self) -> None:
        """Build one prompt now, so the first request of the run does not pay for the counter's
        and the builder's one-time set-up."""
        try:
            first = self.planner.item(0)[0]
        except (IndexError, ValueError):
            return
        self.builder.build(first, None)

    def close(self) -> None:
        for loop in self.open_loops.values():
            loop.stop()
        self.health.stop()
        self.watchdog.stop()
        self.recorder.close()


def prepare_user_client(client) -> None:
    """Every status is read as a result, not raised: the body of an error is recorded."""
    client.client.valid_response_codes = ALL_STATUSES
