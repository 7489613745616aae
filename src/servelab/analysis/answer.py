"""The answer to "which variant wins at which load", read from stored rows only.

Runs are split into paths: the runs of one profile on one hardware, either measured or
predicted, as each run's own ``predicted`` flag says (runs.flags), never as a caller claims. Per
path:

- who leads each metric of LEAD_METRICS at each load level: the winner that ``compare_groups``
  names per stage (the comparison's own judgement over stage_summary, with its bootstrap telling
  whether the lead is outside run-to-run noise), so the answer cannot disagree with ``servelab
  compare``;
- where the throughput leader changes (the crossover) between two neighbouring loads;
- each variant's SLO frontier (``slo_frontier_at(target)``, via frontier.frontier_rows) and, at
  the first load that misses the target, its attainment there (stage_summary.slo_attainment, the
  worst stage at that level, as the macro reads a level);
- the SLOs (run_classes), the run flags (run_overview), and the traffic the stages really carried
  (stage_summary's prompt and output token means).

The wording lives in answer_text.py and the figure in answer_plot.py; nothing here defines a metric.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import duckdb

from .catalogue import METRICS
from .db import fetch_dicts
from .frontier import DEFAULT_TARGET, FrontierRow, frontier_rows

# Throughput, then the two latencies the shipped profiles set SLOs on (TTFT and TPOT), at the
# percentile a user notices for each: the slow tail of first tokens, the typical pace after.
LEAD_METRICS = ("output_tokens_per_s", "ttft_p99_ms", "tpot_p50_ms")
THROUGHPUT = LEAD_METRICS[0]


@dataclass
class Lead:
    """One metric at one load level."""
    level: float
    winner: str | None  # None: a tie, or fewer than two variants with requests there
    clear: bool | None  # the lead over the runner-up is outside run-to-run noise (None: unknown)
    values: dict[str, float]


@dataclass
class Crossover:
    metric: str
    before: Lead
    after: Lead

    @property
    def was(self) -> str:
        return self.before.winner

    @property
    def now(self) -> str:
        return self.after.winner


@dataclass
class Frontier:
    row: FrontierRow
    attainment_at_failing: float | None  # SLO attainment at row.first_failing


@dataclass
class PathAnswer:
    kind: str  # "measured" | "predicted"
    profile: str
    hardware: str | None
    backend: str | None  # runs.tags.backend: sim, local, compose, external, predict
    run_ids: list[str]
    labels: dict[str, str]  # run id -> label (the variant)
    unit: str  # "users" | "requests/s"
    leads: dict[str, list[Lead]]
    frontier: list[Frontier]
    slos: list[dict]  # run_classes rows of the first run: class_name, slo_* columns
    flags: dict[str, list[str]]  # label -> flags other than 'predicted'
    prompt_tokens: float | None  # mean over the measured windows' completed requests
    output_tokens: float | None
    rows: dict[str, list[dict]] = field(default_factory=dict)  # label -> '(all)' stage rows

    @property
    def levels(self) -> list[float]:
        """The loads with requests, whether or not two variants ran them."""
        return sorted({r["level"] for rows in self.rows.values() for r in rows if r["level"] is not None})

    def crossovers(self, metric: str = THROUGHPUT) -> list[Crossover]:
        """Each change of leader between neighbouring loads that both have one."""
        named = [lead for lead in self.leads.get(metric, []) if lead.winner is not None]
        return [Crossover(metric, a, b) for a, b in zip(named, named[1:]) if a.winner != b.winner]

    def runs_of(self) -> dict[str, str]:
        """label -> run id."""
        return {label: run for run, label in self.labels.items()}


@dataclass
class Answer:
    paths: list[PathAnswer]
    target: float


def read_answer(con: duckdb.DuckDBPyConnection, run_ids: list[str], target: float = DEFAULT_TARGET,
                boot: int = 200) -> Answer:
    """The answer over these runs: one PathAnswer per (measured or predicted, profile, hardware),
    predicted paths first (the wide sweeps), then in the order the runs were given."""
    overview = {r["run_id"]: r for r in fetch_dicts(
        con, "SELECT run_id, variant, profile_name, hardware, flags, tags FROM run_overview "
        "WHERE list_contains(?, run_id)", [run_ids])}
    missing = [r for r in run_ids if r not in overview]
    if missing:
        raise ValueError(f"runs not in the database: {', '.join(missing)}")
    keys: dict[tuple, list[str]] = {}
    for run in run_ids:
        row = overview[run]
        kind = "predicted" if "predicted" in (row["flags"] or []) else "measured"
        keys.setdefault((kind, row["profile_name"], row["hardware"]), []).append(run)
    # Each view read once for every run: stage_summary costs a scan per read, whatever it filters.
    rows: dict[str, list[dict]] = {r: [] for r in run_ids}
    for row in fetch_dicts(con, "SELECT * FROM stage_summary WHERE list_contains(?, run_id) "
                           "AND class_name = '(all)' AND requests > 0 ORDER BY run_id, level, stage", [run_ids]):
        rows[row["run_id"]].append(row)
    frontier = {f.run_id: f for f in frontier_rows(con, run_ids, {r: r for r in run_ids}, target)}
    order = sorted(keys, key=lambda k: k[0] != "predicted")
    read = _Read(overview, rows, frontier, target, boot)
    return Answer([_read_path(con, key, keys[key], read) for key in order], target)


@dataclass
class _Read:
    """What read_answer read once for all runs, keyed by run id."""
    overview: dict[str, dict]
    rows: dict[str, list[dict]]
    frontier: dict[str, FrontierRow]
    target: float
    boot: int


def _read_path(con, key: tuple, runs: list[str], read: _Read) -> PathAnswer:
    from .groups import groups_for_runs

    kind, profile, hardware = key
    groups = groups_for_runs(con, runs)
    labels = {r: g.label for g in groups for r in g.run_ids}
    rows = {labels[r]: read.rows[r] for r in runs}
    tags = read.overview[runs[0]]["tags"] or {}
    flags = {labels[r]: [f for f in read.overview[r]["flags"] or [] if f != "predicted"] for r in runs}
    prompt, output = _traffic(rows)
    kinds = {r["kind"] for rs in rows.values() for r in rs}
    frontier = [replace(read.frontier[r], label=labels[r]) for r in runs if r in read.frontier]
    return PathAnswer(
        kind, profile, hardware, tags.get("backend"), runs, labels,
        "requests/s" if kinds & {"rate", "trace"} else "users", _leads(con, groups, read.boot),
        _frontier(frontier, rows), _slos(con, runs[0]),
        {k: v for k, v in flags.items() if v}, prompt, output, rows)


def _leads(con, groups, boot: int) -> dict[str, list[Lead]]:
    """Per metric of LEAD_METRICS, the comparison's winner at each stage with requests."""
    from .compare import compare_groups

    leads: dict[str, list[Lead]] = {m: [] for m in LEAD_METRICS}
    if len(groups) < 2:
        return leads
    for stage in compare_groups(con, groups, boot=boot).stages:
        level = next((v for v in stage.levels.values() if v is not None), None)
        for m in stage.metrics:
            if m.metric in leads and level is not None and any(not math.isnan(v) for v in m.values.values()):
                leads[m.metric].append(Lead(level, m.winner, m.winner_clear, dict(m.values)))
    return leads


def _traffic(rows: dict[str, list[dict]]) -> tuple[float | None, float | None]:
    """Mean prompt and output tokens of the completed requests counted, all stages together."""
    sums = [0.0, 0.0]
    n = 0
    for r in (r for rs in rows.values() for r in rs):
        if r["completed"] and r["prompt_tokens_mean"] is not None and r["output_tokens_mean"] is not None:
            sums[0] += r["prompt_tokens_mean"] * r["completed"]
            sums[1] += r["output_tokens_mean"] * r["completed"]
            n += r["completed"]
    return (sums[0] / n, sums[1] / n) if n else (None, None)


def _frontier(frontier: list[FrontierRow], rows: dict[str, list[dict]]) -> list[Frontier]:
    out = []
    for row in frontier:
        # The worst stage at that level, as the macro reads a level.
        at = [r["slo_attainment"] for r in rows[row.label]
              if r["level"] == row.first_failing and r["slo_attainment"] is not None]
        out.append(Frontier(row, min(at) if at else None))
    # The most load first; at equal load, the variant keeping more requests within SLO where it misses.
    out.sort(key=lambda f: (-(f.row.max_level if f.row.max_level is not None else -1.0),
                            -(f.attainment_at_failing if f.attainment_at_failing is not None else 2.0)))
    return out


def _slos(con, run_id: str) -> list[dict]:
    return fetch_dicts(con, "SELECT class_name, slo_ttft_ms, slo_tpot_ms, slo_itl_ms, slo_e2e_ms FROM run_classes "
                       "WHERE run_id = ? ORDER BY class_name", [run_id])


def better_is(metric: str) -> str:
    """'highest' or 'lowest': how the catalogue ranks the metric."""
    return "highest" if METRICS[metric].better == "higher" else "lowest"


__all__ = ["Answer", "Crossover", "Frontier", "LEAD_METRICS", "Lead", "PathAnswer", "THROUGHPUT", "read_answer"]
