"""Wiring servelab into Locust's events and custom messages (``install`` is called by the
locustfile). The same process can be master, worker or both (a local run without workers):
``MasterSide`` runs the run (collector, shape driver), ``WorkerSide`` answers the master's
messages with this process's run context."""
from __future__ import annotations

import functools
import gc
import logging
import os
import signal
import time

import gevent
import orjson
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from servelab.core.errors import ServelabError
from servelab.core.timeouts import WORKERS_READY_S
from servelab.loadgen import messages
from servelab.loadgen.master.collector import Collector
from servelab.loadgen.options import (Settings, Timeouts, add_arguments, adopt_credentials,
                                      check_profile_now, settings_from, try_adopt)
from servelab.loadgen.shapes import ManualShape, ManualStages, ProfileShape, StageDriver
from servelab.loadgen.users import LLMUser, OpenLoopUser, StreamingUser, report_request
from servelab.loadgen.worker import context as workers
from servelab.store.runs import may_idle
from servelab.store.spool import check_id

log = logging.getLogger("servelab.loadgen")
# A worker whose master sent no heartbeat for this long stops (drains, spools, exits). Locust's
# own limit is 60 s, in which a worker with no master goes on loading the server; the master
# sends one every second, from a loop that never blocks (its database work is on a thread).
MASTER_SILENT_S = 10.0
LEAVE_ACK_S = 5.0   # a worker leaving on its own waits this long for its last acks


def install(events, open_db=None) -> None:
    """``open_db(path)``: how the master opens the database for writing (the locustfile passes
    ``analysis.views.open_results_db``, so the file holds the views too)."""
    _cache_locust_defaults()
    sides: dict = {}

    def on_init(environment, **_kw) -> None:
        runner = environment.runner
        if runner is None:
            return
        try_adopt(environment)
        _arm_stopping(environment, runner)
        if isinstance(runner, (WorkerRunner, LocalRunner)):
            WorkerSide(environment).register(runner)
        if isinstance(runner, (MasterRunner, LocalRunner)):
            sides["master"] = _start_master(environment, runner, open_db)

    def on_test_start(environment, **_kw) -> None:
        # A worker has the master's options (the web UI's key included) from the spawn message
        # that fired this event; a master may have a new host from the web UI.
        try_adopt(environment)
        if "master" in sides and isinstance(environment.runner, (MasterRunner, LocalRunner)):
            sides["master"].ensure_run()

    def on_test_stopping(environment, **_kw) -> None:
        if "master" in sides:
            if getattr(environment.parsed_options, "headless", True):
                # Headless, Locust quits after this run. The web UI outlives its runs: there
                # Ctrl-C and SIGTERM must still stop the process afterwards (an ignored signal
                # cannot be handed back to gevent), so they stay armed.
                _ignore_more_stop_signals()
            sides["master"].end_run(None)

    def on_test_stop(environment, **_kw) -> None:
        if isinstance(environment.runner, (WorkerRunner, LocalRunner)):
            ctx = workers.current_now()
            if ctx is not None:
                ctx.recorder.flush(0.3)
                workers.install(None)

    def on_quitting(environment, **_kw) -> None:
        # Ctrl-C or SIGTERM: Locust fires quitting before it stops the runner.
        _ignore_more_stop_signals()
        if "master" in sides:
            sides["master"].end_run("interrupted")
            sides["master"].collector.close()
        workers.install(None)

    events.init_command_line_parser.add_listener(add_arguments)
    events.init.add_listener(on_init)
    events.test_start.add_listener(on_test_start)
    events.test_stopping.add_listener(on_test_stopping)
    events.test_stop.add_listener(on_test_stop)
    events.quitting.add_listener(on_quitting)


def _arm_stopping(environment, runner) -> None:
    """SIGTERM stops like Ctrl-C; a worker drains before it leaves and stops without a master."""
    if isinstance(runner, WorkerRunner):
        # A worker keeps Locust's own SIGTERM handler (installed after this, and there all
        # along on a worker); two handlers would start two shutdowns.
        _stop_signals_like_ctrl_c(signal.SIGINT)
    else:
        _stop_signals_like_ctrl_c(signal.SIGTERM, signal.SIGINT)
    if isinstance(runner, WorkerRunner):
        # Quitting listeners fire last-added first: this one drains before Locust's own
        # tells the master that this worker quit (and before its users are killed).
        environment.events.quitting.add_listener(lambda **_kw: worker_leaves(environment))
        gevent.spawn(_watch_master, environment)


def _start_master(environment, runner, open_db) -> MasterSide:
    check_profile_now(environment.parsed_options)
    master = MasterSide(environment, open_db)
    master.register(runner)
    from servelab.loadgen import web

    if environment.web_ui is not None:
        web.install(environment, master)
    else:   # headless: --api-port, or an ephemeral port for the sidecar's readers
        web.serve_headless(environment, master)
    return master


class MasterSide:
    def __init__(self, environment, open_db=None):
        self.env = environment
        self.collector = Collector(environment, open_db)
        self.driver: StageDriver | None = None
        self.manual: ManualStages | None = None
        self.last_error: str | None = None   # why the last run could not start (web UI)
        # Both shapes ask this side for their ticks; the mode (option, or the web form's) picks.
        shapes = [environment.shape_class, *(environment.available_shape_classes or {}).values()]
        self.plan_shape = next((s for s in shapes if isinstance(s, ProfileShape)), None) \
            or ProfileShape()
        self.plan_shape.ticks = self.shape_tick
        self.manual_shape = ManualShape()
        self.manual_shape.ticks = self.manual_tick
        self.use_mode(getattr(environment.parsed_options, "mode", "plan") or "plan")

    def use_mode(self, mode: str) -> None:
        shape = self.manual_shape if mode == "manual" else self.plan_shape
        shape.runner = self.env.runner
        self.env.shape_class = shape

    def ui_status(self) -> dict:
        """What the web UI and the JSON API show beside the collector's status."""
        opts = self.env.parsed_options
        return {"mode": getattr(opts, "mode", "plan") or "plan", "last_error": self.last_error,
                "level_check": self.manual.check() if self.manual is not None else None}

    def register(self, runner) -> None:
        runner.register_message(messages.ROWS, self._on_rows)
        runner.register_message(messages.DRAINED, self._on_drained)
        runner.register_message(messages.READY, self._on_ready)

    def _on_rows(self, environment, msg, **_kw) -> None:
        self.collector.on_rows(msg.node_id, msg.data)
        if self.manual is not None and msg.data.get("health"):
            # The batch's newest health sample only: one small parse per batch, not per row.
            last = orjson.loads(msg.data["health"].rstrip(b"\n").rsplit(b"\n", 1)[-1])
            self.manual.observe(last.get("worker"), last.get("t_unix", 0.0),
                                last.get("in_flight"))

    def _on_drained(self, environment, msg, **_kw) -> None:
        self.collector.on_drained(msg.node_id, msg.data)

    def _on_ready(self, environment, msg, **_kw) -> None:
        self.collector.on_ready(msg.node_id, msg.data)

    def ensure_run(self) -> bool:
        """Start the run record once per test (from the first shape tick or from test_start)."""
        from servelab.profiles import load_profile
        from servelab.profiles.planner import RequestPlanner

        c, env = self.collector, self.env
        if c.active:
            return True
        try:
            adopt_credentials(env)
            settings = settings_from(env.parsed_options)
            if not settings.profile:
                raise ServelabError("--profile is required (a traffic profile YAML, e.g. "
                                    "traffic_profiles/smoke.yaml)")
            profile = load_profile(settings.profile)
            shaped = settings.mode != "manual"
            c.start_run(settings, profile, shaped)
            freeze_heap()
        except ServelabError as exc:
            self._fail(str(exc))
            return False
        self.last_error = None
        _set_connect_timeout(settings)
        self.driver = self.manual = None
        if shaped:
            stages = RequestPlanner(profile, c.record.seed).stages()
            self.driver = StageDriver(c, env.runner, stages, LLMUser, OpenLoopUser)
        else:
            self.manual = ManualStages(c, env.runner, env.parsed_options,
                                       settings.manual_warmup_s, LLMUser,
                                       may_idle(c.record.profile_text))
        return True

    def shape_tick(self):
        if not self.ensure_run() or self.driver is None:
            return None
        return self.driver.tick()

    def manual_tick(self):
        if not self.ensure_run() or self.manual is None:
            return None
        return self.manual.tick()

    def end_run(self, status: str | None) -> None:
        """Close the current stage, drain the workers and write the final record (once).
        ``status`` None: completed if the shape ran to its end, else interrupted."""
        c = self.collector
        if not c.active:
            return
        if status is None:
            status = "completed" if self.driver is None or self.driver.finished else "interrupted"
        if self.driver is not None:
            self.driver.stop()
        if self.manual is not None:
            self.manual.stop()
        c.drain_and_finish(status)

    def _fail(self, message: str) -> None:
        log.error("servelab: %s", message)
        print(f"servelab: {message}", flush=True)
        self.last_error = message
        if self.env.web_ui is not None:
            # The web UI outlives a run that could not start: the shape's tick answers None, so
            # Locust ends the test (back to its start form), and the UI shows the message.
            return
        self.env.process_exit_code = 2
        if self.env.runner is not None:
            gevent.spawn_later(0.1, self.env.runner.quit)


class WorkerSide:
    def __init__(self, environment):
        self.env = environment

    def register(self, runner) -> None:
        runner.register_message(messages.RUN, self._on_run)
        runner.register_message(messages.STAGE, self._on_stage)
        runner.register_message(messages.OPEN_STAGES, self._on_open_stages)
        runner.register_message(messages.DRAIN, self._on_drain)
        runner.register_message(messages.ACK, self._on_ack)

    def _on_run(self, environment, msg, **_kw) -> None:
        workers.install(None)
        gevent.spawn(self._build_context, msg.data)

    def _build_context(self, run: dict) -> None:
        s = dict(run["settings"])
        s["timeouts"] = Timeouts(**s["timeouts"])
        settings = Settings(**s)
        _set_connect_timeout(settings)
        runner = self.env.runner
        try:
            # The run id names this worker's spool folder: never trust it unchecked.
            check_id(run["run_id"], "the master's run id")
            ctx = workers.WorkerContext(self.env, settings, run, report_request)
            ctx.warm_up()
            freeze_heap()
        except Exception as exc:  # noqa: BLE001 - reported to the master, which notes it
            log.exception("servelab: this worker cannot take part in run %s: %s",
                          run["run_id"], exc)
            runner.send_message(messages.READY, {"run_id": run["run_id"], "worker": None,
                                                 "error": f"{type(exc).__name__}: {exc}"})
            return
        workers.install(ctx)
        runner.send_message(messages.READY, {"run_id": run["run_id"], "worker": ctx.worker,
                                             "error": None})

    @staticmethod
    def _with_context(fn, run_id: str | None) -> None:
        ctx = workers.current(WORKERS_READY_S)
        if ctx is None or (run_id is not None and ctx.run_id != run_id):
            return
        fn(ctx)

    def _on_stage(self, environment, msg, **_kw) -> None:
        ctx = workers.current_now()
        if ctx is not None:
            ctx.set_stage(msg.data)
        else:
            gevent.spawn(self._with_context, lambda c: c.set_stage(msg.data), None)

    def _on_open_stages(self, environment, msg, **_kw) -> None:
        gevent.spawn(self._with_context, lambda c: c.announce_open_stages(msg.data["stages"]),
                     msg.data["run_id"])

    def _on_drain(self, environment, msg, **_kw) -> None:
        def drain(ctx):
            report = ctx.drain(msg.data["timeout_s"])
            self.env.runner.send_message(messages.DRAINED, report)

        gevent.spawn(self._with_context, drain, msg.data["run_id"])

    def _on_ack(self, environment, msg, **_kw) -> None:
        ctx = workers.current_now()
        if ctx is not None and ctx.run_id == msg.data["run_id"]:
            ctx.recorder.acked(msg.data["batch"])


def worker_leaves(environment) -> None:
    """A worker stopping on its own (SIGTERM, SIGINT, its master gone): stop sending, let the
    requests in flight finish, spool and ship their rows, tell the master it drained; only then
    may the spool close and Locust kill the users."""
    _ignore_more_stop_signals()
    ctx = workers.current_now()
    if ctx is None:
        return
    report = ctx.leave(ctx.settings.drain_timeout_s, LEAVE_ACK_S)
    if report is not None:
        try:
            environment.runner.send_message(messages.DRAINED, report)
        except Exception as exc:  # noqa: BLE001 - the master may be gone; the spool has it all
            log.warning("servelab: could not tell the master this worker drained: %s", exc)


def _watch_master(environment) -> None:
    """Stop this worker within seconds of its master's death (SIGTERM to itself: the same path
    as any stop signal, so what finished is drained and spooled)."""
    runner = environment.runner
    while True:
        gevent.sleep(1.0)
        last = getattr(runner, "last_heartbeat_timestamp", None)
        ctx = workers.current_now()
        silent = last is not None and time.time() - last > MASTER_SILENT_S
        if silent or (ctx is not None and ctx.master_gone()):
            log.error("servelab: the master is gone (%s); stopping this worker",
                      "no heartbeat for %.0f s" % (time.time() - last) if silent
                      else "its process exited")
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _ignore_more_stop_signals() -> None:
    """Once this process is stopping, a second SIGTERM or SIGINT (a parent-death signal after a
    stop signal, an impatient caller) must not start a second shutdown over the drain: Locust
    runs one per SIGTERM, and the second exits in the middle of the first. SIGKILL still ends it;
    ``core.procs`` sends it after its grace period."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:
        pass   # not the main thread


def _stop_signals_like_ctrl_c(*signals) -> None:
    """Headless with a shape, Locust's master blocks in the shape until it ends and installs its
    SIGTERM handler only after it: until then SIGTERM killed it on the spot (no drain, the run
    left `running`). SIGTERM and SIGINT now throw KeyboardInterrupt into the main greenlet, as
    Ctrl-C does, where Locust catches it around the shape and turns it into its stop: the
    drain, the final record, the workers' quit (and no traceback of the hub in the log), even
    in a process started from a background shell, which inherits SIGINT ignored. The
    first stop signal also makes the next ones ignored, so none lands in the middle of that.
    (SIGINT's default handler raised KeyboardInterrupt in whichever greenlet ran: a user's.)"""
    main = gevent.get_hub().parent

    def first_stop():
        _ignore_more_stop_signals()
        main.throw(KeyboardInterrupt)

    for sig in signals:
        gevent.signal_handler(sig, first_stop)


def _set_connect_timeout(settings: Settings) -> None:
    StreamingUser.connection_timeout = settings.timeouts.connect_s


def _cache_locust_defaults() -> None:
    """A worker handling a spawn message builds Locust's whole argument parser once per option
    key (``runners.py``: ``k not in argument_parser.default_args_dict()`` in a comprehension):
    measured 20-60 ms of blocked event loop per message, in every stream's timestamps. The
    function is pure within a process, so its result is computed once."""
    from locust import argument_parser

    if not hasattr(argument_parser.default_args_dict, "cache_info"):
        argument_parser.default_args_dict = functools.lru_cache(maxsize=1)(
            argument_parser.default_args_dict)


def freeze_heap() -> None:
    """Move everything built so far out of the garbage collector's sight.

    A full collection walks every tracked object: with Locust, gevent, numpy and the tokenizer
    loaded that took 55-90 ms per pass (measured in bench/loadgen.py), a stall in every stream's
    timestamps. Frozen objects are never walked again; the run's own garbage stays collectable.
    """
    gc.collect()
    gc.freeze()
