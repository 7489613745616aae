"""The server's own phase means per stage from its /metrics histograms (view
``server_phase_means``, analysis/43_server_phase_means.sql): where TTFT goes by the server's
account on any vLLM or SGLang server that servelab scraped, spans or not."""
from __future__ import annotations

import duckdb

ORDER = ("intake", "queue", "prefill", "ttft", "decode", "e2e")


def phase_mean_lines(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    try:
        rows = con.execute("SELECT stage, level, phase, mean_ms, requests FROM server_phase_means "
                           "WHERE run_id = ? AND mean_ms IS NOT NULL ORDER BY stage",
                           [run_id]).fetchall()
    except duckdb.CatalogException:
        return []
    by_stage: dict[int, dict] = {}
    for stage, level, phase, mean, n in rows:
        by_stage.setdefault(stage, {"level": level})[phase] = (mean, n)
    lines = []
    for stage, got in sorted(by_stage.items()):
        parts = [f"{p} {got[p][0]:.1f}" for p in ORDER if p in got]
        lines.append(f"server /metrics phase means, stage {stage} (load {got['level']:g}), ms: "
                     + ", ".join(parts))
    return lines
