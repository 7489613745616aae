"""``--exact``: stage_summary's ITL percentiles replaced by the exact ones.

stage_summary reads ITL percentiles from itl_stage_quantiles, which merges the per-request DDSketch
sketches (within 1% relative of the exact figure, any distribution). itl_stage_quantiles_exact sorts
every chunk gap instead: exact, and affordable for the runs of one summary or comparison, not for a
whole campaign file at once (the filter on run_id keeps the read to those runs)."""
from __future__ import annotations

import duckdb

# stage_summary column -> (ITL view, itl_stage_quantiles_exact column)
EXACT_ITL = {
    "itl_p50_ms": ("token", "p50_ms"), "itl_p90_ms": ("token", "p90_ms"),
    "itl_p95_ms": ("token", "p95_ms"), "itl_p99_ms": ("token", "p99_ms"),
    "itl_chunk_p50_ms": ("chunk", "p50_ms"), "itl_chunk_p99_ms": ("chunk", "p99_ms"),
}


def exact_itl(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[tuple, dict[str, float]]:
    """(run_id, stage, class_name) -> the exact ITL columns of stage_summary for these runs."""
    cur = con.execute(
        "SELECT run_id, stage, class_name, view, p50_ms, p90_ms, p95_ms, p99_ms "
        "FROM itl_stage_quantiles_exact WHERE list_contains(?, run_id)", [list(run_ids)])
    by_view: dict[tuple, dict[str, dict[str, float]]] = {}
    for run_id, stage, cls, view, *qs in cur.fetchall():
        by_view.setdefault((run_id, stage, cls), {})[view] = dict(zip(("p50_ms", "p90_ms", "p95_ms", "p99_ms"), qs))
    return {key: {col: views.get(view, {}).get(q) for col, (view, q) in EXACT_ITL.items()}
            for key, views in by_view.items()}


def with_exact_itl(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> list[dict]:
    """stage_summary rows with their ITL percentiles exact (itl_quantile_method = 'exact')."""
    exact = exact_itl(con, sorted({r["run_id"] for r in rows}))
    out = []
    for r in rows:
        r = dict(r)
        got = exact.get((r["run_id"], r["stage"], r["class_name"]))
        r.update(got or {col: None for col in EXACT_ITL})
        r["itl_quantile_method"] = "exact" if got else None
        out.append(r)
    return out
