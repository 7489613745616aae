"""Run one traffic profile against a server (or a simulator started for it) and record it in DuckDB:
what ``servelab run`` does, callable in-process (the matrix calls it once per variant).

Locust runs in child processes (``python -m locust -f loadtests/locustfile.py``), so gevent's
monkey-patching never touches this process. Progress comes from the status file the master
rewrites every second; the database is opened only after the master has closed it, because
DuckDB lets one process hold a file and the master is that process while it runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from servelab.core import credentials, timeouts
from servelab.core.errors import ServelabError
from servelab.core.procs import Child, free_port, log_tail, spawn
from servelab.orchestration import otlp, server_telemetry
from servelab.store.spool import check_id


@dataclass
class RunOptions:
    """One run; the fields are ``servelab run``'s flags."""
    profile: str | Path
    target: str | None = None        # None: start a simulator on a free port for this run
    variant: str | None = None
    hardware: str | None = None
    faults: str | None = None        # the simulator's --faults (only without a target)
    workers: int | str = 0           # Locust worker processes; 0: the master runs the users;
    #                                  "auto": orchestration.workers decides
    db: str | Path | None = None     # None: $SERVELAB_DB or results/servelab.duckdb
    tags: dict = field(default_factory=dict)
    seed: int | None = None
    run_id: str | None = None        # None: time stamp + random suffix
    spool_dir: str | Path | None = None
    late_ms: float = 10.0
    drain_timeout_s: float = timeouts.DRAIN_S
    timeouts: timeouts.RequestTimeouts = timeouts.REQUEST
    quiet: bool = False              # no live progress, only the summary
    api_key: str | None = None       # None: $OPENAI_API_KEY (core.credentials); never recorded
    headers: list = field(default_factory=list)   # "Name: value" items; empty: $SERVELAB_HEADERS
    log: str | Path | None = None    # with a target: the server's log, read by verify
    gpu_telemetry: str | None = None  # auto | nvml | dcgm=URL | off (orchestration.gpu_telemetry)
    otlp_port: int | None = None     # the master's OTLP span receiver; None or 0: a free port
    server_kind: str | None = None   # with a target: vllm | sglang (None: the variant's, else vLLM)


@dataclass
class RunResult:
    run_id: str
    exit_code: int          # 0 when the run completed, 1 when it ended otherwise
    status: str             # the runs table's status: completed, interrupted, failed ...
    db: Path
    logs: Path
    interrupted: bool = False   # Ctrl-C, SIGINT or SIGTERM reached this process during the run
    error_rate: float | None = None   # failed requests / requests (None: no request)
    flags: list = field(default_factory=list)


class _StopSignals:
    """SIGTERM and SIGINT do what Ctrl-C does, whoever sends them and even when this process was
    started with SIGINT ignored (a shell's background job): the first one raises
    KeyboardInterrupt, which stops the run through the drain; later ones are only counted, so
    the clean-up they interrupt is never cut short (no child is left behind)."""

    def __init__(self):
        self.received = 0
        self.raise_now = True
        self._old = {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received += 1
        if self.raise_now and self.received == 1:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run_profile(opt: RunOptions) -> RunResult:
    """Replay the profile, print the per-stage summary, and say how the run ended. Bad input and
    a run that never started raise ``ServelabError``."""
    from servelab.core.paths import default_db, loadtests_dir
    from servelab.loadgen.options import new_run_id
    from servelab.profiles import load_profile

    profile = load_profile(opt.profile)
    opt = _without_credentials(opt)
    variant = _check_variant(opt)
    opt = _with_workers(opt, profile)
    db = Path(opt.db) if opt.db else default_db()
    run_id = check_id(opt.run_id or new_run_id(), "--run-id")
    claim_run_id(db, run_id)
    locustfile = loadtests_dir() / "locustfile.py"
    if not locustfile.is_file():
        raise ServelabError(f"{locustfile}: missing; set SERVELAB_HOME to the servelab checkout")
    logs = db.parent / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    status_file = logs / "status.json"
    sim = telemetry = None
    # One port, fixed before either side starts: the server must be told where to send spans
    # before the master (which listens there) exists.
    opt = replace(opt, otlp_port=opt.otlp_port or free_port())
    with _StopSignals() as signals:
        try:
            if opt.target:
                target = opt.target.rstrip("/")
                check_target(target)
                hardware = opt.hardware
                kind = otlp.kind_name(opt.server_kind, opt.variant)
                print(f"servelab: the server's own per-request spans (request_phases) come "
                      f"when it runs with {otlp.told(opt.otlp_port, kind)}", flush=True)
            else:
                sim, target = start_simulator(opt, logs)
                hardware = opt.hardware or "L40S"
            telemetry = server_telemetry.start(opt.gpu_telemetry, opt.target, sim is not None,
                                               logs)
            cmd = locust_command(opt, locustfile, target, hardware, db, run_id, status_file)
            code, interrupted = _supervise_locust(cmd, opt.workers, logs, status_file,
                                                  opt.quiet, profile, signals)
        finally:
            signals.raise_now = False
            if sim is not None:
                sim.stop()
            if telemetry is not None:
                telemetry.stop()
        # after the master let go of the file: the iterations of the server's log, GPU samples
        server_telemetry.ingest_after_run(db, run_id, opt.log if opt.target else logs / "sim.log",
                                          telemetry)
        status, error_rate, flags = _report(db, run_id, status_file, logs, code)
        interrupted = interrupted or signals.received > 0
    if variant is not None and opt.target:
        from servelab.orchestration.verify import verify_target_run

        verdict = verify_target_run(db, run_id, variant, opt.target, opt.log)
        print(verdict.summary(), flush=True)
    return RunResult(run_id, 0 if status == "completed" else 1, status, db, logs, interrupted,
                     error_rate, flags)


def _without_credentials(opt: RunOptions) -> RunOptions:
    """The target's user:password and the key leave the options here: the clean URL is all that
    is passed on or recorded, the credentials reach children through their environment."""
    clean, basic = credentials.split_url(opt.target)
    if opt.api_key or opt.headers or basic:
        clean, creds = credentials.build(opt.api_key, opt.headers, opt.target)
        credentials.install(creds)
    else:
        credentials.current()   # as installed (the matrix) or from the environment
    return replace(opt, target=clean, api_key=None, headers=[])


def _with_workers(opt: RunOptions, profile) -> RunOptions:
    """--workers as a count: ``auto`` picks one for the profile and says why."""
    if opt.workers == "auto":
        from servelab.orchestration.workers import auto_workers

        count, why = auto_workers(profile, starts_simulator=not opt.target)
        print(f"servelab: {why}", flush=True)
        opt = replace(opt, workers=count)
    if opt.workers < 0:
        raise ServelabError("--workers: must be 0 (one local process) or more")
    return opt


def _check_variant(opt: RunOptions):
    """The variant named by --variant, and a --log that exists; verify reads both after a run
    against --target. ``servelab run`` refuses an unknown name before this (commands/run.py);
    a caller passing only a label (the matrix, for a variant loaded from a file, verifies on
    its own) gets None here."""
    if opt.log and not Path(opt.log).is_file():
        raise ServelabError(f"--log {opt.log}: no such file; give the server's log file")
    if not opt.variant:
        return None
    from servelab.specs.variants import load_variant

    try:
        return load_variant(opt.variant)
    except ServelabError:
        return None


def claim_run_id(db: Path, run_id: str) -> None:
    from servelab.store.db import open_db

    con = open_db(db)  # creates the file, or fails now if another process holds it
    try:
        taken = con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone()
    finally:
        con.close()
    if taken:
        raise ServelabError(f"--run-id {run_id}: {db} already has a run with that id; "
                            "choose another name")


def check_target(target: str) -> None:
    """The target must answer HTTP before a run starts (any status, any body will do: the run
    records what its requests get)."""
    from servelab.core import bounded_http

    try:
        # the head is all this asks for: a body of any size or pace is the run's business
        answer = bounded_http.fetch(target, "/v1/models", headers=credentials.headers(),
                                    deadline_s=timeouts.HTTP_PROBE_S, max_bytes=0)
    except ValueError as exc:
        raise ServelabError(f"--target {target}: {exc}; give the server's base URL, e.g. "
                            "http://127.0.0.1:8000") from None
    if answer.status is not None:
        return
    raise ServelabError(f"--target {target}: not reachable: GET /v1/models "
                        f"{bounded_http.describe(answer.outcome)} ({answer.outcome}: "
                        f"{answer.seen()}); start the server first, or leave out --target to "
                        "use the simulator")


def start_simulator(opt: RunOptions, logs: Path) -> tuple[Child, str]:
    """``servelab sim`` on a free port, sending its spans to the run's receiver; returns the
    child and its base URL."""
    cmd = [sys.executable, "-m", "servelab.commands.sim", "--port", "0",
           "--ready-file", str(logs / "sim.ready"), "--enable-logging-iteration-details"]
    if opt.otlp_port:
        cmd += [otlp.FLAG, otlp.endpoint(opt.otlp_port)]
    for flag, value in (("--variant", opt.variant), ("--hardware", opt.hardware),
                        ("--faults", opt.faults)):
        if value:
            cmd += [flag, value]
    if opt.seed is not None:
        cmd += ["--seed", str(opt.seed)]
    # The simulator asks for the run's key as vLLM would (VLLM_API_KEY, never its command line);
    # without one it asks for none, whatever this shell's VLLM_API_KEY says.
    env = dict(os.environ, **otlp.SERVER_ENV, VLLM_API_KEY=credentials.current().api_key or "")
    sim = spawn("the simulator", cmd, logs / "sim.log", env=env, ready_file=logs / "sim.ready",
                parent_death_signal=signal.SIGTERM)
    return sim, sim.wait_ready(timeouts.SIM_READY_S).rstrip("/")


def locust_command(opt: RunOptions, locustfile: Path, target: str, hardware: str | None,
                   db: Path, run_id: str, status_file: Path) -> list[str]:
    """The headless Locust command line (the master's, or the single local process's)."""
    spool = Path(opt.spool_dir) if opt.spool_dir else db.parent / "spool"
    t = opt.timeouts
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless",
           "--host", target, "--profile", str(opt.profile), "--db", str(db),
           "--run-id", run_id, "--status-file", str(status_file),
           "--spool-dir", str(spool), "--exit-code-on-error", "0", "--only-summary",
           "--drain-timeout", str(opt.drain_timeout_s), "--late-ms", str(opt.late_ms),
           "--timeout-connect", str(t.connect),
           "--timeout-first-token", str(t.first_token),
           "--timeout-between-chunks", str(t.between_chunks),
           "--timeout-total", str(t.total)]
    if opt.tags:
        cmd += ["--tag", ",".join(f"{k}={v}" for k, v in opt.tags.items())]
    if opt.seed is not None:
        cmd += ["--seed", str(opt.seed)]
    if opt.variant:
        cmd += ["--variant", opt.variant]
    if hardware:
        cmd += ["--hardware", hardware]
    if opt.otlp_port:
        cmd += ["--otlp-port", str(opt.otlp_port)]
    if opt.server_kind:
        cmd += ["--server-kind", opt.server_kind]
    return cmd



def _supervise_locust(cmd: list[str], workers: int, logs: Path, status_file: Path, quiet: bool,
                      profile, signals: _StopSignals) -> tuple[int | None, bool]:
    """Start the master (and workers), show progress until the master exits, then make sure no
    child is left. Returns the master's exit status and whether a stop signal interrupted the
    run."""
    from servelab.orchestration.progress import watch

    env = dict(os.environ, PYTHONUNBUFFERED="1", **credentials.current().environ())
    master_cmd = list(cmd)
    if workers:
        port = free_port()
        master_cmd += ["--master", "--master-bind-host", "127.0.0.1",
                       "--master-bind-port", str(port), "--expect-workers", str(workers),
                       "--expect-workers-max-wait", f"{timeouts.WORKERS_READY_S:g}"]
    master = None
    children: list[Child] = []
    interrupted = False
    try:
        # SIGTERM when this process dies, even by SIGKILL: the master ends the run interrupted
        master = spawn("the Locust master", master_cmd, logs / "master.log", env=env,
                       parent_death_signal=signal.SIGTERM)
        for i in range(workers):
            wcmd = [sys.executable, "-m", "locust", "-f", cmd[cmd.index("-f") + 1], "--worker",
                    "--master-host", "127.0.0.1", "--master-port", str(port)]
            children.append(spawn(f"Locust worker {i}", wcmd, logs / f"worker{i}.log", env=env,
                                  parent_death_signal=signal.SIGTERM))
        watch(master, status_file, quiet, profile)
    except KeyboardInterrupt:
        # Locust's own stop path: the master drains the workers and writes the record. SIGTERM,
        # not SIGINT: a child started from a background shell inherits SIGINT ignored.
        interrupted = True
        if master is not None:
            master.send_signal(signal.SIGTERM)
            try:
                master.wait(timeouts.MASTER_EXIT_S)
            except subprocess.TimeoutExpired:
                pass
    finally:
        signals.raise_now = False   # from here on a signal must not cut the clean-up short
        for child in children:
            if master is not None and master.alive():
                break   # stop() below ends the master first, then the workers
            try:
                child.wait(timeouts.STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        code = master.stop() if master is not None else None
        for child in children:
            child.stop()
    return code, interrupted


def _report(db: Path, run_id: str, status_file: Path, logs: Path,
            code: int | None) -> tuple[str, float | None, list]:
    """Print the analysis layer's summary of the run and how it ended; returns its status, its
    error rate and its flags."""
    import duckdb

    from servelab.analysis.db import open_for_reading
    from servelab.analysis.summary import make_console, print_summary
    from servelab.orchestration.progress import read_status
    from servelab.store.ingest import resolve_abandoned
    from servelab.store.runs import error_rate, saturation

    console = make_console()
    resolve_abandoned(db)   # a master that died (SIGKILL) left its run `running`
    con = open_for_reading(db)
    try:
        row = con.execute("SELECT status, notes, flags FROM runs WHERE run_id = ?",
                          [run_id]).fetchone()
        if row is None:
            raise ServelabError(f"the run did not start (Locust exit {code}); "
                                f"{logs / 'master.log'} ends with:\n"
                                f"{log_tail(logs / 'master.log', 30)}")
        status, notes, flags = row
        rate = error_rate(con, run_id)
        try:
            print_summary(con, run_id, console)
        except duckdb.Error as exc:  # the rows are stored; `servelab summary` can try again
            console.print(f"[yellow]the summary failed ({exc})[/]")
        try:
            from servelab.analysis.phases import phase_lines

            for line in phase_lines(con, run_id):
                console.print(line)
        except duckdb.Error as exc:   # a file from before the phase views: no phases to show
            console.print(f"[yellow]the server phases could not be read ({exc})[/]")
        for s in saturation(con, run_id):
            seen = (f"worker {s.worker} in stage {s.stage}: loop-lag p99 "
                    f"{s.loop_lag_p99_ms:.1f} ms, its CPU {s.cpu_percent:.0f}%")
            if s.cause == "host":
                console.print(f"[bold red]host busy[/]: {seen}, host CPU "
                              f"{s.host_cpu_percent or 0:.0f}% (typical second); other "
                              f"processes on this host took the CPU; latencies include that "
                              f"wait; run on a quieter host")
            else:
                console.print(f"[bold red]generator saturated[/]: {seen} (typical second); "
                              f"add --workers or hosts")
    finally:
        con.close()
    final = read_status(status_file)
    console.print(f"run {run_id}: {status}; {final.get('stored', '?')} requests stored of "
                  f"{final.get('produced', '?')} produced; database {db}; logs {logs}")
    for note in (notes or "").split("; "):
        if note:
            console.print(f"[yellow]note[/]: {note}")
    if status != "completed":
        console.print(f"[red]the run ended {status}[/]")
    return status, rate, list(flags or [])
