"""``servelab run``: a traffic profile against a server (or the built-in simulator), recorded in
DuckDB; ``servelab ingest``: load a spool that a lost worker left behind. The supervision of the
simulator and the Locust processes is ``servelab.orchestration.runner``'s."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from servelab.core import timeouts
from servelab.specs.server_kinds import KINDS

# Exit codes of `servelab run` (docs/loadgen.md, "Signals and exit codes").
EXIT_OK, EXIT_NOT_COMPLETED, EXIT_BAD_INPUT, EXIT_ERROR_RATE, EXIT_FLAGGED = 0, 1, 2, 3, 4
DEFAULT_MAX_ERROR_RATE = 0.5
# rows_lost: the stored rows are not the whole run; no_requests: there are none. A busy CI
# machine's generator_saturated or a server's bad_values are measurements, not a broken run: opt
# in with --fail-on.
DEFAULT_FAIL_ON = ("rows_lost", "no_requests")
TIMEOUTS = ("connect", "first_token", "between_chunks", "total")
# RunOptions fields that are the flag's value as argparse gives it.
PLAIN = ("profile", "target", "variant", "hardware", "faults", "workers", "db", "seed", "run_id",
         "spool_dir", "late_ms", "quiet", "log", "api_key", "otlp_port",
         "gpu_telemetry", "server_kind")


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="replay a traffic profile with Locust and record every request in DuckDB",
        description="Start a headless Locust master and N worker processes (one local process "
        "when N is 0), replay the profile's load plan against the target (the simulator when no "
        "--target is given), show progress, and print the per-stage summary.")
    add_run_flags(p)
    p.add_argument("--max-error-rate", type=_rate, default=DEFAULT_MAX_ERROR_RATE,
                   metavar="R", help="exit 3 when more than this share of the requests failed "
                   f"(0-1; default {DEFAULT_MAX_ERROR_RATE:g}; 1 never fails on errors)")
    p.add_argument("--fail-on", default=",".join(DEFAULT_FAIL_ON), metavar="FLAG,...",
                   help="exit 4 when the run carries one of these flags (default "
                   f"{','.join(DEFAULT_FAIL_ON)}; '' for none; e.g. rows_lost,bad_values,"
                   "generator_saturated)")
    p.set_defaults(func=run)

    p = sub.add_parser("ingest", help="load the rows a lost worker spooled but never shipped",
                       description="Load spool folders (results/spool/RUN/WORKER, or a run's "
                       "folder) into the database; rows already stored are skipped.")
    p.add_argument("spools", nargs="+", metavar="SPOOL")
    p.add_argument("--db", help="DuckDB file (default: $SERVELAB_DB or results/servelab.duckdb)")
    p.set_defaults(func=ingest)


def add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="traffic profile YAML")
    p.add_argument("--target", help="base URL of an OpenAI-compatible server (default: start "
                   "`servelab sim` on a free port and stop it afterwards)")
    p.add_argument("--variant", help="server variant name (recorded; with no --target the "
                   "simulator serves this variant)")
    p.add_argument("--log", metavar="FILE", help="with --target and --variant: the server's "
                   "log, which verify reads with its /metrics after the run")
    p.add_argument("--hardware", help="with no --target: the simulator's GPU (servers/hardware)")
    p.add_argument("--server-kind", choices=list(KINDS), help="with --target: the server's framework "
                   "(vllm, the default, or sglang; default: the --variant's): how it is told to "
                   "send its spans, and SGLang's requests carry servelab's id as `rid`")
    p.add_argument("--gpu-telemetry", metavar="MODE", help="GPU samples into gpu_metrics: auto "
                   "(NVML when --target is on this host; the default), nvml, off, or dcgm=URL "
                   "of a DCGM exporter's /metrics")
    p.add_argument("--faults", help="with no --target: the simulator's fault injection spec")
    p.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY' to the "
                   "target (default: $OPENAI_API_KEY, which keeps the key out of `ps`); never "
                   "recorded. With no --target the simulator requires it")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra request header for other auth schemes (repeatable; default: "
                   "$SERVELAB_HEADERS, one per line); never recorded")
    p.add_argument("--workers", type=_workers, default=0, help="Locust worker processes, or "
                   "'auto' (from this host's cores and the plan's peak users; 0: one "
                   "local process, the default)")
    p.add_argument("--db", help="DuckDB file (default: $SERVELAB_DB or results/servelab.duckdb)")
    p.add_argument("--otlp-port", type=int, help="receive the server's OTLP spans on "
                   "127.0.0.1:PORT (default: a free port; fix it to start a --target server "
                   "first with --otlp-traces-endpoint http://127.0.0.1:PORT/v1/traces)")
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
    p.add_argument("--drain-timeout", type=float, default=timeouts.DRAIN_S, metavar="S",
                   help="seconds in-flight requests get to finish at the end "
                   f"(default {timeouts.DRAIN_S:g})")
    for name in TIMEOUTS:
        default = getattr(timeouts.REQUEST, name)
        flag = name.replace("_", "-")
        p.add_argument(f"--timeout-{flag}", type=float, default=default, metavar="S",
                       help=f"request timeout: {flag.replace('-', ' ')} (default {default:g} s)")
    p.add_argument("--quiet", action="store_true", help="no live progress, only the summary")


def _workers(text: str):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of worker processes (0: one "
                                         "local process) or 'auto'") from None


def run_options(given: dict) -> dict:
    """RunOptions fields from parsed flags (``vars(args)``); a flag absent from ``given`` is left
    out, so the matrix can apply only the ``--run-arg`` flags a user wrote."""
    from servelab.loadgen.options import parse_tags

    fields = {k: given[k] for k in PLAIN if k in given}
    if "drain_timeout" in given:
        fields["drain_timeout_s"] = given["drain_timeout"]
    limits = {k: given[f"timeout_{k}"] for k in TIMEOUTS if f"timeout_{k}" in given}
    if limits:
        fields["timeouts"] = replace(timeouts.REQUEST, **limits)
    if "tag" in given:
        fields["tags"] = parse_tags(given["tag"])
    if "header" in given:
        fields["headers"] = list(given["header"])
    return fields


def run_arg_fields(extra: list[str]) -> dict:
    """``servelab matrix --run-arg``: the RunOptions fields the extra ``servelab run`` flags set."""
    from servelab.core.errors import ServelabError

    parser = argparse.ArgumentParser(prog="servelab matrix --run-arg", add_help=False)
    add_run_flags(parser)
    for action in parser._actions:
        action.default, action.required = argparse.SUPPRESS, False
    try:
        given = vars(parser.parse_args(extra))
    except SystemExit:  # argparse has printed why
        raise ServelabError(f"--run-arg {' '.join(extra)}: not `servelab run` flags") from None
    return run_options(given)


# ---- servelab run ---------------------------------------------------------------------------
def run(args) -> int:
    from servelab.orchestration.runner import RunOptions, run_profile

    if args.variant:  # an unknown name is an error listing the known ones (exit 2)
        from servelab.specs.variants import load_variant

        load_variant(args.variant)
    result = run_profile(RunOptions(**run_options(vars(args))))
    return exit_code(result, args.max_error_rate,
                     [f.strip() for f in args.fail_on.split(",") if f.strip()])


def exit_code(result, max_error_rate: float, fail_on: list[str]) -> int:
    """What CI reads: 0 a complete run within the limits; 1 it did not complete (interrupted by
    a signal or Ctrl-C, its master died, or it failed); 3 too many failed requests; 4 flagged."""
    from servelab.analysis.summary import make_console

    console = make_console()
    if result.status != "completed" or result.interrupted:
        return EXIT_NOT_COMPLETED
    if result.error_rate is not None and result.error_rate > max_error_rate:
        console.print(f"[red]error rate {result.error_rate:.1%} is above --max-error-rate "
                      f"{max_error_rate:g}[/] (exit {EXIT_ERROR_RATE})")
        return EXIT_ERROR_RATE
    failing = [f for f in result.flags if f in fail_on]
    if failing:
        console.print(f"[red]the run is flagged {', '.join(failing)}[/] (--fail-on; exit "
                      f"{EXIT_FLAGGED})")
        return EXIT_FLAGGED
    return EXIT_OK


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a share between 0 and 1, e.g. 0.05")
    return value


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
                      + (f", {r.torn} torn lines skipped" if r.torn else "")
                      + (f", {r.repaired} rows stored with bad values set to NULL (data_quality)"
                         if r.repaired else "")
                      + (f", {r.rejected} lines rejected" if r.rejected else "") + known)
    return 0
