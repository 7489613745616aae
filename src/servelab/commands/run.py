"""``servelab run``: a traffic profile against a server (or the built-in simulator), recorded in
DuckDB; ``servelab ingest``: load a spool that a lost worker left behind.

Locust runs in child processes (``python -m locust -f loadtests/locustfile.py``), so gevent's
monkey-patching never touches this process. Progress comes from the status file the master
rewrites every second; the database is opened only after the master has closed it.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="replay a traffic profile with Locust and record every request in DuckDB",
        description="Start a headless Locust master and N worker processes (one local process "
        "when N is 0), replay the profile's load plan against the target (the simulator when no "
        "--target is given), show progress, and print the per-stage summary.")
    p.add_argument("--profile", required=True, help="traffic profile YAML")
    p.add_argument("--target", help="base URL of an OpenAI-compatible server (default: start "
                   "`servelab sim` on a free port and stop it afterwards)")
    p.add_argument("--variant", help="server variant name (recorded; with no --target the "
                   "simulator serves this variant)")
    p.add_argument("--hardware", help="with no --target: the simulator's GPU (servers/hardware)")
    p.add_argument("--faults", help="with no --target: the simulator's fault injection spec")
    p.add_argument("--workers", type=int, default=0, help="Locust worker processes (0: one "
                   "local process, the default)")
    p.add_argument("--db", help="DuckDB file (default: $SERVELAB_DB or results/servelab.duckdb)")
    p.add_argument("--tag", action="append", default=[], metavar="K=V",
                   help="label recorded with the run (repeatable)")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("--run-id", metavar="ID", help="name the run (letters, digits, '.', '_', '-'; "
                   "must be new in the database; default: time stamp + random suffix)")
    p.add_argument("--spool-dir", default=None, help="where workers spool their rows "
                   "(default: results/spool)")
    p.add_argument("--late-ms", type=float, default=10.0, metavar="MS",
                   help="open loop: an arrival sent more than this after its scheduled time is "
                   "recorded as late (default 10)")
    p.add_argument("--drain-timeout", type=float, default=60.0, metavar="S",
                   help="seconds in-flight requests get to finish at the end (default 60)")
    for name, default in (("connect", 10.0), ("first-token", 300.0),
                          ("between-chunks", 60.0), ("total", 1800.0)):
        p.add_argument(f"--timeout-{name}", type=float, default=default, metavar="S",
                       help=f"request timeout: {name.replace('-', ' ')} (default {default:g} s)")
    p.add_argument("--quiet", action="store_true", help="no live progress, only the summary")
    p.set_defaults(func=run)

    p = sub.add_parser("ingest", help="load the rows a lost worker spooled but never shipped",
                       description="Load spool folders (results/spool/RUN/WORKER, or a run's "
                       "folder) into the database; rows already stored are skipped.")
    p.add_argument("spools", nargs="+", metavar="SPOOL")
    p.add_argument("--db", help="DuckDB file (default: $SERVELAB_DB or results/servelab.duckdb)")
    p.set_defaults(func=ingest)


# ---- servelab run ---------------------------------------------------------------------------
def run(args) -> int:
    from servelab.core.errors import ServelabError
    from servelab.loadgen.options import new_run_id, parse_tags
    from servelab.core.paths import default_db, loadtests_dir
    from servelab.profiles import load_profile
    from servelab.store.db import open_db

    profile = load_profile(args.profile)
    tags = parse_tags(args.tag)
    if args.workers < 0:
        raise ServelabError("--workers: must be 0 (one local process) or more")
    db = Path(args.db) if args.db else default_db()
    run_id = args.run_id or new_run_id()
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", run_id):
        raise ServelabError(f"--run-id {run_id!r}: use 1-100 letters, digits, '.', '_' or '-'")
    con = open_db(db)  # creates the file, or fails now if another process holds it
    try:
        taken = con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone()
    finally:
        con.close()
    if taken:
        raise ServelabError(f"--run-id {run_id}: {db} already has a run with that id; "
                            "choose another name")
    locustfile = loadtests_dir() / "locustfile.py"
    if not locustfile.is_file():
        raise ServelabError(f"{locustfile}: missing; set SERVELAB_HOME to the servelab checkout")
    results = db.parent
    logs = results / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    spool = Path(args.spool_dir) if args.spool_dir else results / "spool"
    status_file = logs / "status.json"
    sim = None
    try:
        if args.target:
            target = args.target.rstrip("/")
            check_target(target)
            hardware = args.hardware
        else:
            sim, target = start_simulator(args, logs)
            hardware = args.hardware or "L40S"
        cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless",
               "--host", target, "--profile", str(args.profile), "--db", str(db),
               "--run-id", run_id, "--status-file", str(status_file),
               "--spool-dir", str(spool), "--exit-code-on-error", "0", "--only-summary",
               "--drain-timeout", str(args.drain_timeout), "--late-ms", str(args.late_ms),
               "--timeout-connect", str(args.timeout_connect),
               "--timeout-first-token", str(args.timeout_first_token),
               "--timeout-between-chunks", str(args.timeout_between_chunks),
               "--timeout-total", str(args.timeout_total)]
        if tags:
            cmd += ["--tag", ",".join(f"{k}={v}" for k, v in tags.items())]
        if args.seed is not None:
            cmd += ["--seed", str(args.seed)]
        if args.variant:
            cmd += ["--variant", args.variant]
        if hardware:
            cmd += ["--hardware", hardware]
        code = run_locust(cmd, args.workers, logs, status_file, args.quiet, profile)
        return report(db, run_id, status_file, code, logs)
    finally:
        if sim is not None:
            stop_process(sim)


def check_target(target: str) -> None:
    """The target must answer HTTP before a run starts (any status will do)."""
    import urllib.error
    import urllib.request

    from servelab.core.errors import ServelabError

    try:
        urllib.request.urlopen(target + "/v1/models", timeout=10).close()
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServelabError(f"--target {target}: not reachable ({reason}); start the server "
                            "first, or leave out --target to use the simulator") from None


def start_simulator(args, logs: Path):
    from servelab.core.errors import ServelabError

    ready = logs / "sim.ready"
    cmd = [sys.executable, "-m", "servelab.commands.sim", "--port", "0", "--ready-file", str(ready)]
    if args.variant:
        cmd += ["--variant", args.variant]
    if args.hardware:
        cmd += ["--hardware", args.hardware]
    if args.faults:
        cmd += ["--faults", args.faults]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    log = open(logs / "sim.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ready.exists() and ready.read_text().strip():
            return proc, ready.read_text().strip().rstrip("/")
        if proc.poll() is not None:
            tail = (logs / "sim.log").read_text(errors="replace")[-1500:]
            raise ServelabError(f"the simulator did not start (exit {proc.returncode}):\n{tail}")
        time.sleep(0.1)
    stop_process(proc)
    raise ServelabError("the simulator did not become ready within 120 s; see "
                        f"{logs / 'sim.log'}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_locust(cmd: list[str], workers: int, logs: Path, status_file: Path, quiet: bool,
               profile) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = []
    master_cmd = list(cmd)
    if workers:
        port = free_port()
        master_cmd += ["--master", "--master-bind-host", "127.0.0.1",
                       "--master-bind-port", str(port), "--expect-workers", str(workers),
                       "--expect-workers-max-wait", "120"]
    master = subprocess.Popen(master_cmd, stdout=open(logs / "master.log", "wb"),
                              stderr=subprocess.STDOUT, env=env, start_new_session=True)
    procs.append(master)
    for i in range(workers):
        wcmd = [sys.executable, "-m", "locust", "-f", cmd[cmd.index("-f") + 1], "--worker",
                "--master-host", "127.0.0.1", "--master-port", str(port)]
        procs.append(subprocess.Popen(wcmd, stdout=open(logs / f"worker{i}.log", "wb"),
                                      stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
    try:
        show_progress(master, status_file, quiet, profile)
    except KeyboardInterrupt:
        # Locust's own Ctrl-C path: the master drains the workers and writes the record.
        master.send_signal(signal.SIGINT)
        try:
            master.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pass
    finally:
        for p in procs[1:]:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                stop_process(p)
        if master.poll() is None:
            stop_process(master)
    return master.returncode


def show_progress(master, status_file: Path, quiet: bool, profile) -> None:
    import json

    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    live_ok = console.is_terminal and not quiet
    last_line = 0.0

    def read():
        try:
            return json.loads(status_file.read_text())
        except (OSError, ValueError):
            return None

    if live_ok:
        with Live(console=console, refresh_per_second=2, transient=True) as live:
            while master.poll() is None:
                st = read()
                live.update(progress_text(st, profile))
                time.sleep(0.5)
    else:
        while master.poll() is None:
            st = read()
            if not quiet and st and time.monotonic() - last_line >= 5.0:
                last_line = time.monotonic()
                console.print(progress_text(st, profile), highlight=False)
            time.sleep(0.25)


def progress_text(st: dict | None, profile) -> str:
    if not st:
        return "starting Locust ..."

    def ms(v):
        return "-" if v is None else f"{v:.1f}"

    stage = st.get("stage")
    n = st.get("stages") or "?"
    level = st.get("level")
    kind = st.get("stage_kind") or profile.load.kind
    unit = "req/s" if kind in ("rate", "trace") else "users"
    amount = "" if level is None else f" {level:g} {unit}"
    where = "-" if stage is None else f"{stage + 1}/{n} ({kind}{amount})"
    return (f"{profile.name}  stage {where}  {st.get('elapsed_s', 0):.0f} s  "
            f"requests {st.get('stored', 0)}/{st.get('produced', 0)} stored  "
            f"errors {st.get('errors', 0)}  TTFT p50/p99 {ms(st.get('ttft_p50_ms'))}/"
            f"{ms(st.get('ttft_p99_ms'))} ms  ITL p50/p99 {ms(st.get('itl_p50_ms'))}/"
            f"{ms(st.get('itl_p99_ms'))} ms  [{st.get('state', 'running')}]")


def stop_process(proc) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def report(db: Path, run_id: str, status_file: Path, code: int, logs: Path) -> int:
    import json

    import duckdb

    from servelab.analysis.summary import make_console
    from servelab.core.errors import ServelabError

    console = make_console()
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error as exc:
        raise ServelabError(f"{db}: cannot read the results ({exc})") from None
    try:
        row = con.execute("SELECT status, flags, notes FROM runs WHERE run_id = ?",
                          [run_id]).fetchone()
    finally:
        con.close()
    if row is None:
        tail = (logs / "master.log").read_text(errors="replace")[-2000:]
        raise ServelabError(f"the run did not start (Locust exit {code}); {logs / 'master.log'} "
                            f"ends with:\n{tail}")
    status, flags, notes = row
    print_run_summary(db, run_id, console)
    try:
        final = json.loads(status_file.read_text())
    except (OSError, ValueError):
        final = {}
    console.print(f"run {run_id}: {status}; {final.get('stored', '?')} requests stored of "
                  f"{final.get('produced', '?')} produced; database {db}; logs {logs}")
    for note in (notes or "").split("; "):
        if note:
            console.print(f"[yellow]note[/]: {note}")
    if status == "completed":
        return 0
    console.print(f"[red]the run ended {status}[/]")
    return 1


def print_run_summary(db: Path, run_id: str, console) -> None:
    """The analysis layer's per-stage table; a compact one from the raw rows if it is absent."""
    try:
        from servelab.analysis.db import open_for_reading
        from servelab.analysis.summary import print_summary
    except ImportError:
        open_for_reading = None
    import duckdb
    from rich.table import Table

    if open_for_reading is not None:
        con = open_for_reading(db)
        try:
            print_summary(con, run_id, console)
            _print_saturation(con, run_id, console)
            return
        except duckdb.Error as exc:
            console.print(f"[yellow]the analysis summary failed ({exc}); a compact one "
                          "from the raw rows follows[/]")
        finally:
            con.close()

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            """
            SELECT stage, count(*) FILTER (WHERE NOT warmup AND arrival_status IS DISTINCT FROM
                   'dropped'), count(error_kind) FILTER (WHERE NOT warmup),
                   quantile_cont(ttft_ms, 0.5) FILTER (WHERE NOT warmup AND error_kind IS NULL),
                   quantile_cont(ttft_ms, 0.99) FILTER (WHERE NOT warmup AND error_kind IS NULL),
                   quantile_cont(e2e_ms, 0.5) FILTER (WHERE NOT warmup AND error_kind IS NULL)
            FROM requests WHERE run_id = ? GROUP BY stage ORDER BY stage""", [run_id]).fetchall()
        table = Table(title=f"run {run_id}")
        for col in ("stage", "requests", "errors", "TTFT p50 ms", "TTFT p99 ms", "E2E p50 ms"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(*["-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
                            for v in r])
        console.print(table)
        _print_saturation(con, run_id, console)
    finally:
        con.close()


def _print_saturation(con, run_id: str, console) -> None:
    from servelab.store.runs import saturation

    for s in saturation(con, run_id):
        console.print(f"[bold red]generator saturated[/]: worker {s.worker} in stage {s.stage}: "
                      f"loop-lag p99 {s.loop_lag_p99_ms:.1f} ms, CPU {s.cpu_percent:.0f}% "
                      "(typical second); add --workers or hosts")


# ---- servelab ingest ------------------------------------------------------------------------
def ingest(args) -> int:
    from rich.console import Console

    from servelab.analysis.views import open_results_db
    from servelab.core.paths import default_db
    from servelab.store.ingest import ingest as ingest_spools

    console = Console()
    db = Path(args.db) if args.db else default_db()
    reports = ingest_spools(db, args.spools)
    open_results_db(db).close()  # the views, for the plain duckdb shell
    for r in reports:
        known = "" if r.run_known else " (no such run in the database: rows loaded anyway)"
        console.print(f"{r.path}: run {r.run_id} worker {r.worker}: {r.spooled} rows spooled, "
                      f"{r.added} added, {r.health_added} health samples added, "
                      f"{r.in_flight_lost} requests were in flight when it stopped"
                      + (f", {r.torn} torn lines skipped" if r.torn else "") + known)
    return 0
