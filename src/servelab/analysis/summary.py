"""Terminal tables (rich) of runs and of a run's stages, read from the SQL views."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import duckdb
from rich.console import Console
from rich.table import Table

from .db import fetch_dicts

# What each flag means, for the terminal and the report.
FLAG_MEANING = {
    "generator_saturated": "the load generator was itself the bottleneck (CPU or event-loop lag): "
    "latencies include client delay and the offered load was not fully delivered",
    "rows_lost": "some request rows were produced but never stored: counts and rates are low",
    "predicted": "figures are a prediction (cost model / virtual time), not a measurement of a real server",
    "unverified": "the server was not verified to be the variant it claims to be (the evidence was "
    "missing): read its figures as those of an unknown configuration",
    "variant_mismatch": "the server was checked and does NOT run what its variant claims (e.g. FP8 "
    "W8A8 claimed, weight-only FP8 through Marlin served): its figures are not the variant's",
}


def make_console() -> Console:
    """A console for tables: a terminal's own width; when piped, wide enough not to cut columns."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 180))
    return console


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if abs(value) >= 10000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def level_text(value) -> str:
    """A load level: users as an integer, rates with the decimals they need."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:g}"


def pct(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"


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


STAGE_COLUMNS = [
    # (header, key, formatter)
    ("stage", "stage", str),
    ("load", "level", level_text),
    ("class", "class_name", str),
    ("req", "requests", str),
    ("err", "errors", str),
    ("TTFT p50", "ttft_p50_ms", fmt),
    ("TTFT p99", "ttft_p99_ms", fmt),
    ("p99 adj", "ttft_p99_adj_ms", fmt),
    ("ITL p50", "itl_p50_ms", fmt),
    ("ITL p99", "itl_p99_ms", fmt),
    ("TPOT p50", "tpot_p50_ms", fmt),
    ("E2E p99", "e2e_p99_ms", fmt),
    ("out tok/s", "output_tokens_per_s", fmt),
    ("req/s", "requests_per_s", lambda v: fmt(v, 2)),
    ("goodput", "goodput", lambda v: fmt(v, 2)),
    ("SLO met", "slo_attainment", pct),
]


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
    for col in ("stage", "running", "waiting", "waiting max", "KV use", "KV max", "preempt/s", "prefix hit", "spec accept", "accept len"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["stage"]), fmt(r["running_mean"]), fmt(r["waiting_mean"]), fmt(r["waiting_max"], 0),
            pct(r["kv_cache_usage_mean"]), pct(r["kv_cache_usage_max"]), fmt(r["preemptions_per_s"], 2),
            pct(r["prefix_cache_hit_rate"]), pct(r["spec_acceptance_rate"]), fmt(r["spec_mean_acceptance_length"], 2),
        )
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
        console.print(
            f"stage {r['stage']} open loop: send lag p99 {fmt(r['send_lag_p99_ms'])} ms, late {r['late']}, "
            f"dropped {r['dropped']}; E2E from the scheduled time p99 {fmt(r['e2e_sched_p99_ms'])} ms"
        )
    server = server_table(server_rows(con, run_id))
    if server is not None:
        console.print(server)
