"""Energy per output token beside the latency figures: the ``gpu_stage_energy`` view (definition
in analysis/42_gpu_stage_energy.sql) as a terminal table for ``servelab summary``, a note per
stage for ``servelab compare`` (the report's table: ``report_sections.energy_html``). A run without GPU samples shows none.
"""
from __future__ import annotations

import duckdb

from .catalogue import METRICS, format_ratio, format_value
from .db import fetch_dicts

SHOWN = ["joules_per_output_token", "output_tokens_per_joule", "power_mean_w", "util_mean_pct",
         "sm_clock_mean_mhz", "mem_used_max_mib", "temp_max_c"]


def has_samples(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> bool:
    """Whether any of the runs has GPU samples. Asked first because the view joins
    stage_summary, which DuckDB computes for every run of the file even when no sample matches:
    0.7 s per question on a small file, five questions per ``servelab compare``."""
    try:
        return con.execute("SELECT EXISTS (SELECT 1 FROM gpu_metrics WHERE list_contains(?, "
                           "run_id))", [list(run_ids)]).fetchone()[0]
    except duckdb.CatalogException:   # a file from before the table
        return False


def energy_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    if not has_samples(con, [run_id]):
        return []
    try:
        return fetch_dicts(con, "SELECT * FROM gpu_stage_energy WHERE run_id = ? ORDER BY stage",
                           [run_id])
    except duckdb.CatalogException:   # a file whose views predate the table
        return []


def energy_table(rows: list[dict], console, wide: bool = False):
    """The terminal table, or None without samples."""
    if not rows:
        return None
    from .terminal import Col, fitted_table

    cols = [Col("stage", "stage"), Col("method", "method")] + [
        Col(METRICS[n].header, n, lambda v, n=n: format_value(n, v), optional=i > 1)
        for i, n in enumerate(SHOWN)]
    return fitted_table(console, cols, rows, wide=wide,
                        title="GPU (samples in the measured windows; J/token = energy / output "
                              "tokens)")[0]


def energy_note(con: duckdb.DuckDBPyConnection, groups, stage: int, baseline: str) -> list[str]:
    """'J/token: A 0.412, B 0.305 x0.74' for a stage of ``servelab compare``, the mean over a
    group's runs; nothing when fewer than two groups have GPU samples there."""
    values = {}
    if not has_samples(con, [r for g in groups for r in g.run_ids]):
        return []
    for g in groups:
        try:
            row = con.execute("SELECT avg(joules_per_output_token), avg(output_tokens_per_joule) "
                              "FROM gpu_stage_energy WHERE list_contains(?, run_id) AND stage = ?",
                              [g.run_ids, stage]).fetchone()
        except duckdb.CatalogException:
            return []
        if row[0] is not None:
            values[g.label] = row
    if len(values) < 2:
        return []
    base = values.get(baseline, (None, None))[0]
    parts = []
    for label, (jpt, tpj) in values.items():
        ratio = format_ratio(jpt / base) if base and label != baseline else ""
        parts.append(f"{label} {format_value('joules_per_output_token', jpt)}{ratio} "
                     f"({format_value('output_tokens_per_joule', tpj)} tok/J)")
    return ["energy per output token (J/token, GPU samples; not judged): " + ", ".join(parts)]
