"""Terminal tables (rich) of runs, of a run's stages and of a comparison, read from the SQL views
and formatted through the metric catalogue (catalogue.py)."""
from __future__ import annotations

from datetime import datetime, timezone

import duckdb
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .catalogue import FLAG_MEANING, METRICS, comparison_cell, format_value, level_text
from .db import fetch_dicts

def make_console() -> Console:
    """A console for tables: a terminal's own width; when piped, wide enough not to cut columns."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 180))
    return console


def when(unix) -> str:
    if unix is None:
        return "-"
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def run_rows(con: duckdb.DuckDBPyConnection) -> list[dict]:
    return fetch_dicts(con, "SELECT * FROM run_overview ORDER BY started_unix, run_id")


def runs_table(rows: list[dict]) -> Table:
    table = Table(title="runs", title_justify="left")
    for col in ("run", "started (UTC)", "profile", "variant", "target", "status", "requests", "errors", "flags"):
        table.add_column(col, justify="right" if col in ("requests", "errors") else "left")
    for r in rows:
        flags = ", ".join(r["flags"] or [])
        table.add_row(
            r["run_id"], when(r["started_unix"]), r["profile_name"] or "-", r["variant"] or "-",
            r["target"] or "-", r["status"] or "-", str(r["requests"]), str(r["errors"]),
            f"[bold red]{flags}[/]" if flags else "",
        )
    return table


def stage_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    return fetch_dicts(
        con,
        "SELECT * FROM stage_summary WHERE run_id = ? ORDER BY stage, class_name = '(all)' DESC, class_name",
        [run_id],
    )


def server_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    return fetch_dicts(con, "SELECT * FROM server_stage_summary WHERE run_id = ? ORDER BY stage", [run_id])


# The terminal's stage table: the count columns, then catalogue metrics (its headers and formats).
STAGE_COUNTS = [("stage", "stage", str), ("load", "level", level_text), ("class", "class_name", str),
                ("req", "requests", str), ("err", "errors", str)]
STAGE_METRICS = ["ttft_p50_ms", "ttft_p99_ms", "ttft_p99_adj_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms",
                 "e2e_p99_ms", "output_tokens_per_s", "requests_per_s", "goodput", "slo_attainment"]
STAGE_COLUMNS = STAGE_COUNTS + [(METRICS[n].header, n, lambda v, n=n: format_value(n, v)) for n in STAGE_METRICS]
SERVER_COLUMNS = ["running_mean", "waiting_mean", "waiting_max", "kv_cache_usage_mean", "kv_cache_usage_max",
                  "preemptions_per_s", "prefix_cache_hit_rate", "spec_acceptance_rate",
                  "spec_mean_acceptance_length"]


def stage_table(run: dict, rows: list[dict]) -> Table:
    title = f"run {run['run_id']}  profile {run['profile_name'] or '-'}  variant {run['variant'] or '-'}"
    table = Table(title=title, title_justify="left", caption="latencies in ms over completed requests; "
                  "ITL = per-token view (itl_tokens); p99 adj counts failures as infinitely slow; "
                  "goodput = requests/s meeting every SLO", caption_justify="left")
    for header, key, _ in STAGE_COLUMNS:
        table.add_column(header, justify="left" if key == "class_name" else "right")
    previous = None
    for r in rows:
        if previous is not None and r["stage"] != previous:
            table.add_section()
        previous = r["stage"]
        style = "bold" if r["class_name"] == "(all)" else None
        table.add_row(*[f(r[key]) for _, key, f in STAGE_COLUMNS], style=style)
    return table


def server_table(rows: list[dict]) -> Table | None:
    if not any(r["samples"] for r in rows):
        return None
    table = Table(title="server (scraped /metrics, measured windows)", title_justify="left")
    for col in ["stage"] + [METRICS[n].header for n in SERVER_COLUMNS]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["stage"]), *[format_value(n, r[n]) for n in SERVER_COLUMNS])
    return table


def print_summary(con: duckdb.DuckDBPyConnection, run_id: str, console: Console | None = None) -> None:
    console = console or make_console()
    run = fetch_dicts(con, "SELECT * FROM run_overview WHERE run_id = ?", [run_id])[0]
    for flag in run["flags"] or []:
        console.print(f"[bold red]flag {flag}[/]: {FLAG_MEANING.get(flag, 'set by the recorder')}")
    rows = stage_rows(con, run_id)
    if not rows:
        console.print(f"run {run_id} has no stages recorded")
        return
    console.print(stage_table(run, rows))
    errors = [r for r in rows if r["class_name"] == "(all)" and r["errors_by_kind"]]
    for r in errors:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors_by_kind"].items()))
        console.print(f"stage {r['stage']} errors: {kinds}")
    lagged = [r for r in rows if r["class_name"] == "(all)" and r["send_lag_p99_ms"] is not None]
    for r in lagged:
        lag, e2e = (format_value(n, r[n]) for n in ("send_lag_p99_ms", "e2e_sched_p99_ms"))
        console.print(f"stage {r['stage']} open loop: send lag p99 {lag} ms, late {r['late']}, "
                      f"dropped {r['dropped']}; E2E from the scheduled time p99 {e2e} ms")
    server = server_table(server_rows(con, run_id))
    if server is not None:
        console.print(server)


def comparison_table(result, stage) -> Table:
    """One stage of a comparison (compare.Comparison, compare.StageComparison): a row per metric,
    a column per group; the winner's cell green with a star."""
    levels = ", ".join(f"{k}={v:g}" for k, v in stage.levels.items() if v is not None)
    table = Table(title=f"stage {stage.stage} ({stage.kind}: {levels}), class {result.class_name}; "
                  f"value [95% CI] xratio to {result.baseline}", title_justify="left")
    table.add_column("metric")
    for g in result.groups:
        table.add_column(escape(g.header), justify="right", header_style="bold red" if g.flags else "bold")
    for m in stage.metrics:
        cells = []
        for g in result.groups:
            cell = comparison_cell(m, g.label, result.baseline)
            if cell is None:
                cells.append("-")
                continue
            text, ratio = cell
            text += ratio + (" ~noise" if ratio and m.within_noise.get(g.label) else "")
            cells.append(f"[bold green]{text} *[/]" if m.winner == g.label else text)
        table.add_row(METRICS[m.metric].label, *cells)
    return table


def print_comparison(result, console: Console | None = None) -> None:
    """What `servelab compare` prints: the groups, the caveats of flagged ones, a table and a
    verdict per stage, and the overall verdict."""
    console = console or make_console()
    for g in result.groups:
        console.print(f"{g.label}: runs {', '.join(g.run_ids)}" + (" (repeats)" if len(g.run_ids) > 1 else "")
                      + (f" [bold red]FLAGGED {', '.join(g.flags)}[/]" if g.flags else ""))
    for caveat in result.caveats:
        console.print(f"[bold red]caution[/]: {caveat}")
    for stage in result.stages:
        console.print(comparison_table(result, stage))
        for note in stage.notes:
            console.print(f"[yellow]note[/]: {note}")
        console.print(f"stage {stage.stage}: {stage.verdict}")
    console.print(f"[bold]{result.verdict}[/]")
    for caveat in result.caveats:
        console.print(f"[bold red]caution[/]: {caveat}")
