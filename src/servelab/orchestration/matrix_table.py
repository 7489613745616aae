"""The matrix's side-by-side table (matrix.md) and its JSON twin: per variant and repeat, the
verification, the speed at the highest load level and the output fidelity."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.orchestration.matrix import MatrixResult

SPEED_SQL = """
SELECT s.run_id, s.stage, s.level, s.requests, s.error_rate, s.ttft_p50_ms, s.ttft_p99_ms,
       s.tpot_p50_ms, s.itl_p50_ms, s.output_tokens_per_s, s.goodput, s.slo_attainment
FROM stage_summary s
WHERE s.class_name = '(all)' AND s.run_id IN (SELECT unnest(?::VARCHAR[]))
ORDER BY s.run_id, s.stage
"""


def speed_rows(db: Path, run_ids: list[str]) -> dict[str, list[dict]]:
    """Per run, its stages' speed figures (all classes), lowest stage first."""
    from servelab.analysis.db import fetch_dicts, open_for_reading

    if not run_ids:
        return {}
    con = open_for_reading(db)
    try:
        rows = fetch_dicts(con, SPEED_SQL, [run_ids])
    finally:
        con.close()
    out: dict[str, list[dict]] = {}
    for item in rows:
        out.setdefault(item["run_id"], []).append(item)
    return out


def _fmt(value, spec: str = ".1f", unit: str = "") -> str:
    if value is None:
        return "-"
    try:
        return f"{value:{spec}}{unit}"
    except (TypeError, ValueError):
        return str(value)


# The speed columns, in the table's order; cells are written by the metric catalogue.
SPEED_CELLS = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "goodput",
               "error_rate")


def render_table(result: MatrixResult, speed: dict[str, list[dict]]) -> str:
    """Markdown: per variant and repeat, the verification, the highest load level's speed, and
    fidelity against the first variant."""
    from servelab.analysis.catalogue import format_value, level_text

    fid = result.fidelity.get("candidates", {}) if result.fidelity else {}
    base = result.fidelity.get("baseline") if result.fidelity else None
    head = ("| variant | repeat | status | verified | level | tok/s | TTFT p50 ms | TTFT p99 ms | "
            "TPOT p50 ms | goodput req/s | errors | exact match | 1st divergence | similarity |")
    lines = [f"# servelab matrix {result.matrix_id}", "",
             "Speed at the highest load level of the profile (all classes, measured window); "
             "fidelity against " + (f"`{base}`" if base else "the first variant") +
             " (greedy outputs). A run that is not `verified` says so here: read its numbers "
             "as those of whatever the server really ran.", "", head,
             "|" + "---|" * 14]
    for e in result.entries:
        stages = speed.get(e.run_id or "", [])
        top = stages[-1] if stages else {}
        verified = e.verdict.status if e.verdict else ("predicted" if e.status == "predicted"
                                                       else "-")
        f = fid.get(e.variant.name) if e.repeat == 1 else None
        if e.variant.name == base and e.repeat == 1:
            fx = ("baseline", "", "")
        elif f:
            fx = (_fmt(f["exact_match_rate"], ".0%"), _fmt(f["mean_first_divergence"], ".1f"),
                  _fmt(f["mean_similarity"], ".3f"))
        else:
            fx = ("-", "-", "-")
        cells = [format_value(m, top.get(m)) for m in SPEED_CELLS]
        lines.append(f"| {e.variant.name} | {e.repeat} | {e.status} | {verified} | "
                     f"{level_text(top.get('level'))} | " + " | ".join(cells)
                     + f" | {fx[0]} | {fx[1]} | {fx[2]} |")
    notes = [e for e in result.entries if e.error or (e.verdict and e.verdict.status != "verified")]
    if notes:
        lines += ["", "## Notes", ""]
        for e in notes:
            if e.error:
                lines.append(f"- {e.variant.name} (repeat {e.repeat}): {e.status}: {e.error}")
            if e.verdict and e.verdict.status != "verified":
                bad = [c for c in e.verdict.checks if c.status in ("fail", "unknown", "warn")]
                lines.append(f"- {e.variant.name} (repeat {e.repeat}): {e.verdict.status}: "
                             + "; ".join(f"{c.name}: {c.detail}" for c in bad))
    return "\n".join(lines) + "\n"


def to_json(result: MatrixResult, speed: dict) -> dict:
    return {"matrix_id": result.matrix_id, "fidelity_id": result.fidelity_id,
            "fidelity": result.fidelity,
            "entries": [{"variant": e.variant.name, "repeat": e.repeat, "status": e.status,
                         "run_id": e.run_id, "error": e.error, "log": e.log,
                         "prefix_cache_reset": e.prefix_cache_reset,
                         "verification": json.loads(e.verdict.to_json()) if e.verdict else None,
                         "preflight": e.preflight, "speed": speed.get(e.run_id or "", [])}
                        for e in result.entries]}
