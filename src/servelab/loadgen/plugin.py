"""Wiring servelab into Locust's events and custom messages (``install`` is called by the
locustfile). The same process can be master, worker or both (a local run without workers)."""
from __future__ import annotations

import functools
import gc
import logging

import gevent
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from servelab.core.errors import ServelabError
from servelab.loadgen import collector as coll
from servelab.loadgen import worker as workers
from servelab.loadgen.options import Settings, add_arguments, settings_from
from servelab.loadgen.recorder import ROWS_MESSAGE

log = logging.getLogger("servelab.loadgen")

_collector: coll.Collector | None = None
_driver = None
_manual = None
_env = None


def install(events) -> None:
    _cache_locust_defaults()
    events.init_command_line_parser.add_listener(add_arguments)
    events.init.add_listener(on_init)
    events.test_start.add_listener(on_test_start)
    events.test_stopping.add_listener(on_test_stopping)
    events.test_stop.add_listener(on_test_stop)
    events.quitting.add_listener(on_quitting)


def on_init(environment, **_kw) -> None:
    global _collector, _env
    _env = environment
    runner = environment.runner
    if runner is None:
        return
    if isinstance(runner, (WorkerRunner, LocalRunner)):
        runner.register_message(coll.RUN_MESSAGE, _on_run)
        runner.register_message(coll.STAGE_MESSAGE, _on_stage)
        runner.register_message(coll.OPEN_STAGES_MESSAGE, _on_open_stages)
        runner.register_message(coll.DRAIN_MESSAGE, _on_drain)
        runner.register_message(coll.ACK_MESSAGE, _on_ack)
    if isinstance(runner, (MasterRunner, LocalRunner)):
        _collector = coll.Collector(environment)
        runner.register_message(ROWS_MESSAGE, _on_rows)
        runner.register_message(workers.DRAINED_MESSAGE, _on_drained)
        runner.register_message(workers.READY_MESSAGE, _on_ready)


# ---- master side ----------------------------------------------------------------------------
def _ensure_run() -> bool:
    """Start the run record once per test (from the first shape tick or from test_start)."""
    global _driver, _manual
    c = _collector
    if c is None:
        return False
    if c.active:
        return True
    env = _env
    from servelab.loadgen.shapes import ManualStages, ProfileShape, StageDriver
    from servelab.loadgen.users import LLMUser, OpenLoopUser
    from servelab.profiles import load_profile
    from servelab.profiles.planner import RequestPlanner

    try:
        settings = settings_from(env.parsed_options)
        if not settings.profile:
            raise ServelabError("--profile is required (a traffic profile YAML, e.g. "
                                "traffic_profiles/smoke.yaml)")
        profile = load_profile(settings.profile)
        shaped = isinstance(env.shape_class, ProfileShape)
        c.start_run(settings, profile, shaped)
        freeze_heap()
    except ServelabError as exc:
        _fail(str(exc))
        return False
    LLMUser.connection_timeout = settings.timeouts.connect_s
    OpenLoopUser.connection_timeout = settings.timeouts.connect_s
    if shaped:
        stages = RequestPlanner(profile, c.seed).stages()
        _driver = StageDriver(c, env.runner, stages, LLMUser, OpenLoopUser)
        _manual = None
    else:
        _driver = None
        _manual = ManualStages(c, env.runner)
    return True


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


def _fail(message: str) -> None:
    log.error("servelab: %s", message)
    print(f"servelab: {message}", flush=True)
    if _env is not None:
        _env.process_exit_code = 2
        if _env.runner is not None:
            gevent.spawn_later(0.1, _env.runner.quit)


def shape_tick():
    if not _ensure_run() or _driver is None:
        return None
    return _driver.tick()


def on_test_start(environment, **_kw) -> None:
    if isinstance(environment.runner, (MasterRunner, LocalRunner)):
        _ensure_run()


def on_test_stopping(environment, **_kw) -> None:
    _end_run("completed" if _driver is None or _driver.finished else "interrupted")


def _end_run(status: str) -> None:
    """Close the current stage, drain the workers and write the final record (once)."""
    c = _collector
    if c is None or not c.active:
        return
    if _driver is not None:
        _driver.stop()
    if _manual is not None:
        _manual.stop()
    c.drain_and_finish(status)


def on_test_stop(environment, **_kw) -> None:
    if isinstance(environment.runner, (WorkerRunner, LocalRunner)):
        ctx = workers._current
        if ctx is not None:
            ctx.recorder.flush(0.3)
            workers.install(None)


def on_quitting(environment, **_kw) -> None:
    # Ctrl-C or SIGTERM: Locust fires quitting before it stops the runner.
    _end_run("interrupted")
    if _collector is not None:
        _collector.close()
    if workers._current is not None:
        workers.install(None)


def _on_rows(environment, msg, **_kw) -> None:
    if _collector is not None:
        _collector.on_rows(msg.node_id, msg.data)


def _on_ready(environment, msg, **_kw) -> None:
    if _collector is not None:
        _collector.on_ready(msg.node_id, msg.data)


def _on_drained(environment, msg, **_kw) -> None:
    if _collector is not None:
        _collector.on_drained(msg.node_id, msg.data)


# ---- worker side ----------------------------------------------------------------------------
def _on_run(environment, msg, **_kw) -> None:
    run = msg.data
    workers.install(None)
    gevent.spawn(_build_context, environment, run)


def _build_context(environment, run: dict) -> None:
    from servelab.loadgen.options import Timeouts
    from servelab.loadgen.users import LLMUser, OpenLoopUser

    s = dict(run["settings"])
    s["timeouts"] = Timeouts(**s["timeouts"])
    settings = Settings(**s)
    LLMUser.connection_timeout = settings.timeouts.connect_s
    OpenLoopUser.connection_timeout = settings.timeouts.connect_s
    try:
        ctx = workers.WorkerContext(environment, settings, run)
        ctx.warm_up()
        freeze_heap()
    except Exception as exc:  # noqa: BLE001 - reported to the master, which notes it
        log.exception("servelab: this worker cannot take part in run %s: %s", run["run_id"], exc)
        environment.runner.send_message(workers.READY_MESSAGE, {
            "run_id": run["run_id"], "worker": None, "error": f"{type(exc).__name__}: {exc}"})
        return
    workers.install(ctx)
    environment.runner.send_message(workers.READY_MESSAGE, {"run_id": run["run_id"],
                                                            "worker": ctx.worker, "error": None})


def _with_context(fn, run_id: str | None):
    ctx = workers.current(120.0)
    if ctx is None or (run_id is not None and ctx.run_id != run_id):
        return
    fn(ctx)


def _on_stage(environment, msg, **_kw) -> None:
    ctx = workers._current
    if ctx is not None and workers._ready.is_set():
        ctx.set_stage(msg.data)
    else:
        gevent.spawn(_with_context, lambda c: c.set_stage(msg.data), None)


def _on_open_stages(environment, msg, **_kw) -> None:
    gevent.spawn(_with_context, lambda c: c.announce_open_stages(msg.data["stages"]),
                 msg.data["run_id"])


def _on_drain(environment, msg, **_kw) -> None:
    def drain(ctx):
        report = ctx.drain(msg.data["timeout_s"])
        environment.runner.send_message(workers.DRAINED_MESSAGE, report)

    gevent.spawn(_with_context, drain, msg.data["run_id"])


def _on_ack(environment, msg, **_kw) -> None:
    ctx = workers._current
    if ctx is not None and ctx.run_id == msg.data["run_id"]:
        ctx.recorder.acked(msg.data["batch"])
