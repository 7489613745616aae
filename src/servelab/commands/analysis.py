"""``servelab runs | summary | compare | sql | report``: read the results database through the
SQL views of analysis/*.sql."""
from __future__ import annotations

import argparse
from pathlib import Path


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="the DuckDB results file (default: $SERVELAB_DB or results/servelab.duckdb)")


def register(sub) -> None:
    p = sub.add_parser("runs", help="list the recorded runs")
    _db_arg(p)
    p.set_defaults(func=runs)

    p = sub.add_parser("summary", help="a run's per-stage table: TTFT, ITL, TPOT, E2E, throughput, goodput")
    p.add_argument("run", help="run id, a unique prefix of one, or 'latest'")
    _db_arg(p)
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
    from servelab.analysis.db import open_for_reading
    from servelab.analysis.summary import make_console, run_rows, runs_table

    con = open_for_reading(args.db)
    try:
        rows = run_rows(con)
    finally:
        con.close()
    console = make_console()
    if not rows:
        console.print("no runs recorded yet")
        return 0
    console.print(runs_table(rows))
    return 0


def summary(args) -> int:
    from servelab.analysis.db import open_for_reading, resolve_run
    from servelab.analysis.summary import make_console, print_summary

    con = open_for_reading(args.db)
    try:
        print_summary(con, resolve_run(con, args.run), make_console())
    finally:
        con.close()
    return 0


def compare(args) -> int:
    import math

    from rich.markup import escape
    from rich.table import Table

    from servelab.analysis.compare import METRIC_LABEL, compare_groups, groups_for_runs, groups_for_variants
    from servelab.analysis.db import open_for_reading, resolve_runs
    from servelab.analysis.summary import fmt, make_console, pct
    from servelab.core.errors import ServelabError

    if bool(args.runs) == bool(args.variants):
        raise ServelabError("give either run ids (servelab compare RUN RUN ...) or --variants A,B,..., not both or neither")
    con = open_for_reading(args.db)
    try:
        if args.variants:
            names = [v.strip() for v in args.variants.split(",") if v.strip()]
            groups = groups_for_variants(con, names, args.profile)
        else:
            groups = groups_for_runs(con, resolve_runs(con, args.runs))
        result = compare_groups(con, groups, args.baseline, args.class_name, boot=args.boot, seed=args.seed)
    finally:
        con.close()
    console = make_console()
    for g in result.groups:
        console.print(f"{g.label}: runs {', '.join(g.run_ids)}" + (" (repeats)" if len(g.run_ids) > 1 else "")
                      + (f" [bold red]FLAGGED {', '.join(g.flags)}[/]" if g.flags else ""))
    for caveat in result.caveats:
        console.print(f"[bold red]caution[/]: {caveat}")
    labels = [g.label for g in result.groups]
    headers = {g.label: g.header for g in result.groups}
    for stage in result.stages:
        levels = ", ".join(f"{k}={v:g}" for k, v in stage.levels.items() if v is not None)
        table = Table(title=f"stage {stage.stage} ({stage.kind}: {levels}), class {result.class_name}; "
                      f"value [95% CI] xratio to {result.baseline}", title_justify="left")
        table.add_column("metric")
        for label in labels:
            table.add_column(escape(headers[label]), justify="right", header_style="bold red" if
                             headers[label] != label else "bold")
        for m in stage.metrics:
            cells = []
            for label in labels:
                if label not in m.values:
                    cells.append("-")
                    continue
                share = m.metric in ("slo_attainment", "error_rate")
                conv = pct if share else (lambda v: fmt(v, 2 if m.metric == "goodput" else 1))
                text = conv(m.values[label])
                iv = m.intervals.get(label)
                if iv:
                    text += f" [{conv(iv[0])}, {conv(iv[1])}]"
                if label != result.baseline and label in m.ratios and math.isfinite(m.ratios[label]):
                    text += f" x{m.ratios[label]:.2f}" + (" ~noise" if m.within_noise.get(label) else "")
                if m.winner == label:
                    text = f"[bold green]{text} *[/]"
                cells.append(text)
            table.add_row(METRIC_LABEL[m.metric], *cells)
        console.print(table)
        for note in stage.notes:
            console.print(f"[yellow]note[/]: {note}")
        console.print(f"stage {stage.stage}: {stage.verdict}")
    console.print(f"[bold]{result.verdict}[/]")
    for caveat in result.caveats:
        console.print(f"[bold red]caution[/]: {caveat}")
    return 0


def _jsonable(value):
    import datetime
    import decimal
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else "nan"
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def sql(args) -> int:
    import csv
    import json
    import sys

    import duckdb

    from servelab.analysis.db import open_for_reading
    from servelab.core.errors import ServelabError

    if bool(args.query) == bool(args.file):
        raise ServelabError('give the SQL either as an argument (servelab sql "SELECT ...") or with -f FILE')
    if args.file:
        if not args.file.is_file():
            raise ServelabError(f"-f {args.file}: no such file")
        text = args.file.read_text(encoding="utf-8")
    else:
        text = args.query
    con = open_for_reading(args.db)
    try:
        try:
            cur = con.execute(text)
        except duckdb.Error as exc:
            hint = ""
            if "read-only" in str(exc).lower():
                hint = " (servelab sql opens the database read-only; write with the duckdb CLI on a copy)"
            raise ServelabError(f"{exc}{hint}") from exc
        if cur.description is None:
            return 0
        names = [d[0] for d in cur.description]
        rows = cur.fetchall()
    finally:
        con.close()
    if args.format == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows(rows)
    elif args.format == "json":
        print(json.dumps([{n: _jsonable(v) for n, v in zip(names, row)} for row in rows], indent=1))
    else:
        from rich.table import Table

        from servelab.analysis.summary import fmt, make_console

        table = Table()
        for n in names:
            table.add_column(n)
        for row in rows:
            table.add_row(*[fmt(v, 3) if isinstance(v, float) else ("NULL" if v is None else str(v)) for v in row])
        console = make_console()
        console.print(table)
        console.print(f"{len(rows)} rows")
    return 0


def report(args) -> int:
    from servelab.analysis.db import open_for_reading, resolve_runs
    from servelab.analysis.report import build_report

    con = open_for_reading(args.db)
    try:
        path = build_report(con, resolve_runs(con, args.runs), args.out, boot=args.boot)
    finally:
        con.close()
    print(f"wrote {path} and its PNG figures in {path.parent}")
    return 0
