"""Terminal tables (rich) of runs, of a run's stages and of a comparison, read from the SQL views
and formatted through the metric catalogue (catalogue.py)."""
from __future__ import annotations

from datetime import datetime, timezone

import duckdb
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .catalogue import FLAG_MEANING, METRICS, comparison_cell, format_value, level_text
from .db import fetch_dicts
from .energy import energy_rows, energy_table
from .phase_means import phase_mean_lines
from .exact import with_exact_itl
from .terminal import Col, column_widths, fits, fitted_table, min_width, print_table


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


def _flags(value) -> str:
    flags = ", ".join(value or [])
    return f"[bold red]{flags}[/]" if flags else ""


# Columns hidden last-listed-first when the terminal is narrow (terminal.fitted_table).
RUN_COLUMNS = [
    Col("run", "run_id", justify="left"), Col("status", "status", lambda v: v or "-", justify="left"),
    Col("req", "requests"), Col("err", "errors"), Col("flags", "flags", _flags, justify="left", wrap=True),
    Col("variant", "variant", lambda v: v or "-", optional=True, justify="left"),
    Col("started (UTC)", "started_unix", when, optional=True, justify="left"),
    Col("profile", "profile_name", lambda v: v or "-", optional=True, justify="left"),
    Col("target", "target", lambda v: v or "-", optional=True, justify="left"),
]


def runs_table(rows: list[dict], console: Console | None = None, wide: bool = False) -> Table:
    """The runs; when even the few columns kept do not fit beside the run ids (long matrix ids on
    80 columns), the rows are numbered and the ids listed whole under the table."""
    console = console or make_console()
    essential = [c for c in RUN_COLUMNS if not c.optional]
    if wide or fits(console, essential, rows):
        return fitted_table(console, RUN_COLUMNS, rows, wide=wide, title="runs")[0]
    numbered = [dict(r, __n=str(i)) for i, r in enumerate(rows, 1)]
    legend = "\n".join(f"#{r['__n']} {r['run_id']}" for r in numbered)
    cols = [Col("#", "__n")] + [c for c in RUN_COLUMNS if c.key != "run_id"]
    return fitted_table(console, cols, numbered, title="runs", caption=legend)[0]


def stage_rows(con: duckdb.DuckDBPyConnection, run_id: str, exact: bool = False) -> list[dict]:
    rows = fetch_dicts(
        con,
        "SELECT * FROM stage_summary WHERE run_id = ? ORDER BY stage, class_name = '(all)' DESC, class_name",
        [run_id],
    )
    return with_exact_itl(con, rows) if exact else rows


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


# The terminal's stage table: counts, then catalogue metrics (headers and formats); the optional
# ones are hidden last-listed-first on a narrow terminal, and --wide adds the WIDE_ONLY ones too.
def _metric(name: str, optional: bool = True) -> Col:
    return Col(METRICS[name].header, name, lambda v, n=name: format_value(n, v), optional=optional)


STAGE_COLUMNS = [
    Col("stage", "stage"), Col("load", "level", level_text), Col("class", "class_name", justify="left"),
    Col("req", "requests"), Col("err", "errors"),
    *[_metric(n, optional=False) for n in ("ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s", "slo_attainment")],
    *[_metric(n) for n in ("e2e_p99_ms", "goodput", "ttft_p50_ms", "itl_p50_ms", "tpot_p50_ms",
                           "requests_per_s", "ttft_p99_adj_ms")],
]
WIDE_ONLY = [_metric(n) for n in ("ttft_p90_ms", "itl_chunk_p99_ms", "tpot_p99_ms", "e2e_p50_ms", "error_rate")]
SERVER_COLUMNS = ["running_mean", "waiting_mean", "waiting_max", "kv_cache_usage_mean", "kv_cache_usage_max",
                  "preemptions_per_s", "prefix_cache_hit_rate", "spec_acceptance_rate",
                  "spec_mean_acceptance_length"]


def _itl_note(rows: list[dict]) -> str:
    methods = {r.get("itl_quantile_method") for r in rows} - {None}
    if methods == {"exact"}:
        return "ITL percentiles exact"
    return "ITL percentiles sketched (DDSketch, within 1%; --exact for exact)" if methods else ""


def stage_table(run: dict, rows: list[dict], console: Console | None = None, wide: bool = False) -> Table:
    title = f"run {run['run_id']}  profile {run['profile_name'] or '-'}  variant {run['variant'] or '-'}"
    caption = "; ".join(t for t in (
        "ms over completed requests; ITL per token; p99 adj counts failures as infinitely slow; "
        "goodput = requests/s meeting every SLO", _itl_note(rows)) if t)
    cols = STAGE_COLUMNS + (WIDE_ONLY if wide else [])
    shown = [dict(r, __section=r["stage"]) for r in rows]
    styles = ["bold" if r["class_name"] == "(all)" else None for r in rows]
    return fitted_table(console or make_console(), cols, shown, wide=wide, title=title, caption=caption,
                        styles=styles)[0]


def server_table(rows: list[dict], console: Console | None = None, wide: bool = False) -> Table | None:
    if not any(r["samples"] for r in rows):
        return None
    cols = [Col("stage", "stage")] + [_metric(n) for n in SERVER_COLUMNS]
    return fitted_table(console or make_console(), cols, rows, wide=wide,
                        title="server (scraped /metrics, measured windows)")[0]


def print_summary(con: duckdb.DuckDBPyConnection, run_id: str, console: Console | None = None,
                  wide: bool = False, exact: bool = False) -> None:
    console = console or make_console()
    run = fetch_dicts(con, "SELECT * FROM run_overview WHERE run_id = ?", [run_id])[0]
    for flag in run["flags"] or []:
        console.print(f"[bold red]flag {flag}[/]: {FLAG_MEANING.get(flag, 'set by the recorder')}")
    rows = stage_rows(con, run_id, exact=exact)
    if not rows:
        console.print(f"run {run_id} has no stages recorded")
        return
    print_table(console, stage_table(run, rows, console, wide), wide)
    errors = [r for r in rows if r["class_name"] == "(all)" and r["errors_by_kind"]]
    for r in errors:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors_by_kind"].items()))
        console.print(f"stage {r['stage']} errors: {kinds}")
    lagged = [r for r in rows if r["class_name"] == "(all)" and r["send_lag_p99_ms"] is not None]
    for r in lagged:
        lag, e2e = (format_value(n, r[n]) for n in ("send_lag_p99_ms", "e2e_sched_p99_ms"))
        console.print(f"stage {r['stage']} open loop: send lag p99 {lag} ms, late {r['late']}, "
                      f"dropped {r['dropped']}; E2E from the scheduled time p99 {e2e} ms")
    server = server_table(server_rows(con, run_id), console, wide)
    if server is not None:
        print_table(console, server, wide)
    energy = energy_table(energy_rows(con, run_id), console, wide)
    if energy is not None:
        print_table(console, energy, wide)
    for line in phase_mean_lines(con, run_id):
        console.print(line)


def _comparison_cells(result, stage, groups) -> list[list[str]]:
    rows = []
    for m in stage.metrics:
        cells = []
        for g in groups:
            cell = comparison_cell(m, g.label, result.baseline)
            if cell is None:
                cells.append("-")
                continue
            text, ratio = cell
            text += ratio + (" ~noise" if ratio and m.within_noise.get(g.label) else "")
            cells.append(f"[bold green]{escape(text)} *[/]" if m.winner == g.label else escape(text))
        rows.append([METRICS[m.metric].label, *cells])
    return rows


def comparison_table(result, stage, groups=None, width: int | None = None) -> Table:
    """One stage of a comparison (compare.Comparison, compare.StageComparison): a row per metric,
    a column per group (default: all of them); the winner's cell green with a star. Within
    `width` a cell wraps at its spaces (the interval under the value), never inside a number."""
    groups = groups or result.groups
    rows = _comparison_cells(result, stage, groups)
    headers = ["metric"] + [escape(g.header) for g in groups]
    widths = column_widths(headers, [list(c) for c in zip(*rows)] if rows else [[]] * len(headers), width)
    levels = ", ".join(f"{k}={v:g}" for k, v in stage.levels.items() if v is not None)
    table = Table(title=f"stage {stage.stage} ({stage.kind}: {levels}), class {result.class_name}; "
                  f"value [95% CI] xratio to {result.baseline}", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("metric", width=widths[0])
    for g, w in zip(groups, widths[1:]):
        table.add_column(escape(g.header), justify="right", header_style="bold red" if g.flags else "bold", width=w)
    for row in rows:
        table.add_row(*row)
    return table


def comparison_tables(console: Console, result, stage, wide: bool = False) -> list[Table]:
    """The stage's comparison as tables that fit the console: all groups in one when they fit
    (always with --wide), else the baseline beside as many others as fit, in turn."""
    base = [g for g in result.groups if g.label == result.baseline]
    others = [g for g in result.groups if g.label != result.baseline]
    def fits(groups) -> bool:
        rows = _comparison_cells(result, stage, groups)
        headers = ["metric"] + [escape(g.header) for g in groups]
        return min_width(headers, [list(c) for c in zip(*rows)] if rows else [[]] * len(headers),
                         [False] * len(headers)) <= console.width

    for n in range(len(others), 1, -1):
        chunks = [base + others[i:i + n] for i in range(0, len(others), n)]
        if wide or all(fits(c) for c in chunks):
            return [comparison_table(result, stage, c, None if wide else console.width) for c in chunks]
    return [comparison_table(result, stage, base + [g], console.width) for g in others]


def print_comparison(result, console: Console | None = None, wide: bool = False) -> None:
    """What `servelab compare` prints: the groups, the caveats of flagged ones, a table and a
    verdict per stage, and the overall verdict."""
    console = console or make_console()
    for g in result.groups:
        console.print(f"{g.label}: runs {', '.join(g.run_ids)}" + (" (repeats)" if len(g.run_ids) > 1 else "")
                      + (f" [bold red]FLAGGED {', '.join(g.flags)}[/]" if g.flags else ""))
    for caveat in result.caveats:
        console.print(f"[bold red]caution[/]: {caveat}")
    if not result.itl_exact and any(len(g.run_ids) == 1 for g in result.groups):
        console.print("note: ITL percentiles of single runs are sketched (DDSketch, within 1%); "
                      "--exact computes them exactly")
    for stage in result.stages:
        for table in comparison_tables(console, result, stage, wide):
            print_table(console, table, wide)
        for note in stage.notes:
            console.print(f"[yellow]note[/]: {note}")
        console.print(f"stage {stage.stage}: {stage.verdict}")
    console.print(f"[bold]{result.verdict}[/]")
    for caveat in result.caveats:
        console.print(f"[bold red]caution[/]: {caveat}")
