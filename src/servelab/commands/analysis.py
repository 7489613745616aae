"""``servelab runs | summary | compare | sql | report``: read the results database through the
SQL views of analysis/*.sql."""
from __future__ import annotations

import argparse
from pathlib import Path


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="the DuckDB results file (default: $SERVELAB_DB or results/servelab.duckdb)")


def _output_args(p: argparse.ArgumentParser, exact: bool = True) -> None:
    p.add_argument("--wide", action="store_true",
                   help="every column (default: the columns that fit the terminal; numbers and run ids are never cut)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="table (default), or every column as CSV / JSON on stdout for a pipeline")
    if exact:
        p.add_argument("--exact", action="store_true",
                       help="exact ITL percentiles (sorts every chunk gap of these runs; by default they "
                       "are merged from per-request sketches, within 1%%)")


def register(sub) -> None:
    p = sub.add_parser("runs", help="list the recorded runs")
    _db_arg(p)
    _output_args(p, exact=False)
    p.set_defaults(func=runs)

    p = sub.add_parser("summary", help="a run's per-stage table: TTFT, ITL, TPOT, E2E, throughput, goodput")
    p.add_argument("run", help="run id, a unique prefix of one, or 'latest'")
    _db_arg(p)
    _output_args(p)
    p.set_defaults(func=summary)

    p = sub.add_parser("compare", help="runs or variants side by side per stage, with a winner per metric")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids (or unique prefixes, or 'latest')")
    p.add_argument("--variants", help="comma-separated variant names: their completed runs on one profile")
    p.add_argument("--profile", help="with --variants: the traffic profile whose runs to compare")
    p.add_argument("--baseline", help="the group (variant, label or run id) that ratios refer to (default: the first)")
    p.add_argument("--class", dest="class_name", default="(all)", help="compare one request class (default: all)")
    p.add_argument("--boot", type=int, default=400, help="bootstrap resamples for the confidence intervals (default 400)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    _db_arg(p)
    _output_args(p)
    p.set_defaults(func=compare)

    p = sub.add_parser("sql", help="run SQL over the database, with the analysis views available")
    p.add_argument("query", nargs="?", help="the SQL text")
    p.add_argument("-f", "--file", type=Path, help="read the SQL from a file")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    _db_arg(p)
    p.set_defaults(func=sql)

    p = sub.add_parser("report", help="write report.html (self-contained) and the PNG figures for runs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids (or unique prefixes, or 'latest')")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--boot", type=int, default=200, help="bootstrap resamples for the comparison (default 200)")
    _db_arg(p)
    p.set_defaults(func=report)


def runs(args) -> int:
    from servelab.analysis.db import open_for_reading, resolve_db_path
    from servelab.analysis.export import write_records
    from servelab.analysis.summary import make_console, run_rows, runs_table
    from servelab.analysis.terminal import print_table
    from servelab.store.ingest import resolve_abandoned

    resolve_abandoned(resolve_db_path(args.db))   # a run whose master died: interrupted
    con = open_for_reading(args.db)
    try:
        rows = run_rows(con)
    finally:
        con.close()
    if args.format != "table":
        write_records(rows, args.format)
        return 0
    console = make_console()
    if not rows:
        console.print("no runs recorded yet")
        return 0
    print_table(console, runs_table(rows, console, args.wide), args.wide)
    return 0


def summary(args) -> int:
    from servelab.analysis.db import open_for_reading, resolve_run
    from servelab.analysis.export import write_records
    from servelab.analysis.summary import make_console, print_summary, stage_rows

    con = open_for_reading(args.db)
    try:
        run_id = resolve_run(con, args.run)
        if args.format != "table":
            write_records(stage_rows(con, run_id, exact=args.exact), args.format)
        else:
            print_summary(con, run_id, make_console(), wide=args.wide, exact=args.exact)
    finally:
        con.close()
    return 0


def compare(args) -> int:
    from servelab.analysis.compare import compare_runs
    from servelab.analysis.export import comparison_records, write_records

    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    table = args.format == "table"
    result = compare_runs(args.db, args.runs, variants=variants, profile=args.profile, baseline=args.baseline,
                          class_name=args.class_name, boot=args.boot, seed=args.seed,
                          console=None if table else False, exact=args.exact, wide=args.wide)
    if not table:
        write_records(comparison_records(result), args.format)
    return 0


def sql(args) -> int:
    from servelab.analysis.query import print_rows, run_sql
    from servelab.core.errors import ServelabError

    if bool(args.query) == bool(args.file):
        raise ServelabError('give the SQL either as an argument (servelab sql "SELECT ...") or with -f FILE')
    if args.file and not args.file.is_file():
        raise ServelabError(f"-f {args.file}: no such file")
    result = run_sql(args.db, args.file.read_text(encoding="utf-8") if args.file else args.query)
    if result is not None:
        print_rows(*result, form=args.format)
    return 0


def report(args) -> int:
    from servelab.analysis.report import write_report

    path = write_report(args.db, args.runs, args.out, boot=args.boot)
    print(f"wrote {path} and its PNG figures in {path.parent}")
    return 0
