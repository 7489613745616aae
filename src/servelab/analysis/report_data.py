"""Everything the report draws, read once: one query per view for all its runs (not one per run
and stage), so a 3-variant, 10-level sweep costs a handful of reads and the figures are drawn
from memory.

Distributions: TTFT's CDF is exact (quantile_cont over the requests, one value each); ITL's is
read from the requests' merged DDSketch buckets (itl_sketches, the view itl_stage_quantiles'
method: each point within 1% of the exact value), because sorting every chunk gap of a campaign
file is what made reports slow.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from .db import fetch_dicts
from .frontier import DEFAULT_TARGET, FrontierRow, frontier_rows

CDF_POINTS = [i / 100 for i in range(101)]
CDF_LEVELS = 3  # load levels whose distributions are overlaid: the lowest, a middle one, the highest


@dataclass
class ReportData:
    run_ids: list[str]
    runs: list[dict]
    labels: dict[str, str]
    stage_rows: dict[str, list[dict]]  # run_id -> stage_summary rows
    server_rows: dict[str, list[dict]]
    frontier: list[FrontierRow]
    target: float
    slos: dict[str, float | None]
    cdf_panels: list[dict] = field(default_factory=list)
    client: dict[str, list[dict]] = field(default_factory=dict)
    server: dict[str, list[dict]] = field(default_factory=dict)
    stages: dict[str, list[dict]] = field(default_factory=dict)
    engine: dict[str, list[dict]] = field(default_factory=dict)   # engine_timeline rows

    @property
    def all_rows(self) -> dict[str, list[dict]]:
        """label -> the '(all)' stage rows of its run."""
        return {self.labels[r]: [x for x in self.stage_rows[r] if x["class_name"] == "(all)"] for r in self.run_ids}

    @property
    def predicted(self) -> bool:
        return any("predicted" in (r["flags"] or []) for r in self.runs)


def labels_for(runs: list[dict]) -> dict[str, str]:
    """Run id -> its label: the variant when only one run has it, else variant (run id)."""
    variants = [r["variant"] for r in runs]
    out = {}
    for r in runs:
        if r["variant"] and variants.count(r["variant"]) == 1:
            out[r["run_id"]] = r["variant"]
        elif r["variant"]:
            out[r["run_id"]] = f"{r['variant']} ({r['run_id']})"
        else:
            out[r["run_id"]] = r["run_id"]
    return out


def _by_run(rows: list[dict], run_ids: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {r: [] for r in run_ids}
    for row in rows:
        out[row["run_id"]].append(row)
    return out


def load(con: duckdb.DuckDBPyConnection, run_ids: list[str], target: float = DEFAULT_TARGET) -> ReportData:
    ids = [run_ids]
    overview = {r["run_id"]: r for r in fetch_dicts(con, "SELECT * FROM run_overview WHERE list_contains(?, run_id)", ids)}
    runs = [overview[r] for r in run_ids]
    labels = labels_for(runs)
    stage_rows = _by_run(fetch_dicts(
        con, "SELECT * FROM stage_summary WHERE list_contains(?, run_id) "
        "ORDER BY run_id, stage, class_name = '(all)' DESC, class_name", ids), run_ids)
    slo = con.execute("SELECT min(slo_ttft_ms), min(slo_itl_ms) FROM run_classes WHERE list_contains(?, run_id)",
                      ids).fetchone()
    data = ReportData(
        run_ids, runs, labels, stage_rows,
        _by_run(fetch_dicts(con, "SELECT * FROM server_stage_summary WHERE list_contains(?, run_id) ORDER BY stage", ids), run_ids),
        frontier_rows(con, run_ids, labels, target), target, {"ttft": slo[0], "itl": slo[1]})
    data.cdf_panels = _cdf_panels(con, data)
    data.client = _by_run(fetch_dicts(con, "SELECT * FROM client_timeline WHERE list_contains(?, run_id) ORDER BY t_unix", ids), run_ids)
    data.server = _by_run(fetch_dicts(con, "SELECT * FROM server_timeline WHERE list_contains(?, run_id) ORDER BY t_unix", ids), run_ids)
    data.engine = _by_run(fetch_dicts(con, "SELECT * FROM engine_timeline WHERE list_contains(?, run_id) ORDER BY t_unix", ids), run_ids)
    data.stages = _by_run(fetch_dicts(con, "SELECT * FROM stages WHERE list_contains(?, run_id) ORDER BY stage", ids), run_ids)
    return data


def shared_levels(data: ReportData) -> list[tuple[float, dict[str, int]]]:
    """The load levels every run has a stage with requests at, each with run_id -> that stage;
    at most CDF_LEVELS of them, spread from the lowest to the highest."""
    per_run = []
    for r in data.run_ids:
        levels: dict[float, int] = {}
        for row in data.stage_rows[r]:
            if row["class_name"] == "(all)" and row["level"] is not None and (row["completed"] or 0) > 0:
                levels.setdefault(row["level"], row["stage"])
        per_run.append(levels)
    common = sorted(set.intersection(*(set(x) for x in per_run))) if per_run else []
    if len(common) > CDF_LEVELS:
        picks = {round(i * (len(common) - 1) / (CDF_LEVELS - 1)) for i in range(CDF_LEVELS)}
        common = [common[i] for i in sorted(picks)]
    return [(lv, {r: per_run[i][lv] for i, r in enumerate(data.run_ids)}) for lv in common]


def _cdf_panels(con: duckdb.DuckDBPyConnection, data: ReportData) -> list[dict]:
    levels = shared_levels(data)
    if not levels:
        return []
    ttft = {(r["run_id"], r["stage"]): r["q"] for r in fetch_dicts(
        con, "SELECT run_id, stage, quantile_cont(ttft_ms, ?) AS q FROM request_metrics "
        "WHERE list_contains(?, run_id) AND measured AND ok AND ttft_ms IS NOT NULL GROUP BY run_id, stage",
        [CDF_POINTS, data.run_ids])}
    # The merged sketch of each run x stage: bucket value and the share of samples at or below it.
    itl: dict[tuple, list[tuple[float, float]]] = {}
    for run_id, stage, value, share in con.execute(
            """WITH b AS (
                   SELECT s.run_id, r.stage, unnest(map_keys(s.token_sketch)) AS bin,
                          unnest(map_values(s.token_sketch)) AS n
                   FROM itl_sketches s JOIN request_metrics r USING (run_id, request_id)
                   WHERE list_contains(?, s.run_id) AND r.measured AND r.ok AND s.gaps > 0),
               m AS (SELECT run_id, stage, bin, sum(n) AS n FROM b GROUP BY ALL)
               SELECT run_id, stage, servelab_sketch_value(bin),
                      sum(n) OVER (PARTITION BY run_id, stage ORDER BY bin) / sum(n) OVER (PARTITION BY run_id, stage)
               FROM m ORDER BY run_id, stage, bin""", [data.run_ids]).fetchall():
        itl.setdefault((run_id, stage), []).append((value, share))
    panels = []
    for level, stage_of in levels:
        panel = {"level": level, "ttft": {}, "itl": {}}
        for r, stage in stage_of.items():
            if ttft.get((r, stage)):
                panel["ttft"][data.labels[r]] = list(zip(ttft[(r, stage)], CDF_POINTS))
            if itl.get((r, stage)):
                panel["itl"][data.labels[r]] = [(itl[(r, stage)][0][0], 0.0)] + itl[(r, stage)]
        panels.append(panel)
    return panels
