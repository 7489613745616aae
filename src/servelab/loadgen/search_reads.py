"""What a search reads from the results database: a probe's verdict (stage_summary's
attainment, store.runs' saturation verdict: the metrics' one definition each), whether every
request of a probe's window is stored yet, and a stored search read back whole.

Every function takes a DuckDB connection or cursor: the master's read cursor while it runs, a
read-only connection afterwards, predict's scratch database in virtual time."""
from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from servelab.loadgen.search_rules import (DEFAULT_MAX_ERROR_RATE, DEFAULT_TARGET, KIND,
                                           Answer, Bisection, Probe, start_position)

# Failures that say the server is not there at all: a probe mostly made of them stops the search.
DOWN_KINDS = ("connect_refused", "connect_error", "connect_reset", "timeout_connect")


def read_probe(con, run_id: str, stage: int, position: int, level: float,
               target: float = DEFAULT_TARGET,
               max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> Probe:
    """One stored stage judged as a probe (its rows must all be stored: ``settled_workers``)."""
    from servelab.store.runs import saturation

    row = con.execute(
        "SELECT requests, slo_met_requests, errors, errors_by_kind, dropped FROM stage_summary "
        "WHERE run_id = ? AND stage = ? AND class_name = '(all)'", [run_id, stage]).fetchone()
    requests, met, errors, by_kind, dropped = row or (0, 0, 0, None, 0)
    by_kind = dict(by_kind or {})
    probe = Probe(position, float(level), int(requests), int(met), stage, int(errors),
                  target=target)
    refused = sum(v for k, v in by_kind.items() if k in DOWN_KINDS)
    if requests and refused * 2 > requests:
        probe.down = True
        probe.cause = (f"the server stopped answering ({refused} of {requests} requests could "
                       f"not connect: {', '.join(sorted(k for k in by_kind if k in DOWN_KINDS))})")
        return probe
    for s in saturation(con, run_id):
        if s.stage == stage:
            who = "the generator saturated" if s.cause == "generator" else "the host was busy"
            probe.cause = (f"{who} (worker {s.worker}: loop-lag p99 {s.loop_lag_p99_ms:.1f} ms, "
                           f"its CPU {s.cpu_percent:.0f}%, typical second)"
                           + ("; add --workers" if s.cause == "generator" else
                              "; run on a quieter host"))
            return probe
    offered = requests + int(dropped or 0)
    if not requests:
        probe.cause = "no request was measured in its window"
    elif errors / requests > max_error_rate:
        probe.cause = f"{errors / requests:.0%} of its requests failed (limit {max_error_rate:g})"
    elif dropped and dropped / offered > max_error_rate:
        probe.cause = (f"{dropped} of {offered} arrivals were dropped at max_in_flight (limit "
                       f"{max_error_rate:g})")
    return probe


def settled_workers(con, run_id: str, cutoff_unix: float) -> set[str]:
    """Workers with a request sent at or after ``cutoff_unix`` and every request they numbered
    before it stored. A worker numbers a request (``worker_seq``, from 0) just before sending
    it and stores the row when it ends, so once these hold, every request the worker sent
    before the cutoff is in the table."""
    rows = con.execute(
        """
        WITH firsts AS (
            SELECT worker, min(worker_seq) AS k FROM requests
            WHERE run_id = ? AND coalesce(sent_unix, scheduled_unix) >= ?
            GROUP BY worker)
        SELECT f.worker, any_value(f.k), count(r.worker_seq)
        FROM firsts f
        LEFT JOIN requests r ON r.run_id = ? AND r.worker = f.worker AND r.worker_seq < f.k
        GROUP BY f.worker
        """, [run_id, cutoff_unix, run_id]).fetchall()
    return {worker for worker, k, below in rows if below == k}


def health_until(con, run_id: str) -> dict[str, float]:
    """Each worker's newest stored health sample (``client_health.t_unix``)."""
    rows = con.execute("SELECT worker, max(t_unix) FROM client_health WHERE run_id = ? "
                       "GROUP BY worker", [run_id]).fetchall()
    return {worker: float(t) for worker, t in rows}


@dataclass
class StoredSearch:
    """A search run read back: its rules' inputs, its probes in order and the rules' replay."""
    run_id: str
    over: str                     # concurrency | rate
    status: str | None
    target: float
    max_error_rate: float
    levels: list[float]
    seeded_at: float | None       # the level the search started from (None: bisection)
    search: Bisection
    requests: int                 # every request the run sent (warm-up and tails included)
    off_path: list[int] = field(default_factory=list)   # stages the rules would not have chosen

    @property
    def probes(self) -> list[Probe]:
        return self.search.probes

    @property
    def answer(self) -> Answer:
        return self.search.answer()

    @property
    def unit(self) -> str:
        return "requests/s" if self.over == "rate" else "users"


def is_search_run(con, run_id: str) -> bool:
    row = con.execute("SELECT count(*) FROM stages WHERE run_id = ? AND kind = ?",
                      [run_id, KIND]).fetchone()
    return bool(row and row[0])


def read_stored_search(con, run_id: str) -> StoredSearch:
    """The search of run ``run_id`` replayed from what is stored: each probe judged as the
    master judged it, the levels from the run's profile, the rules' choices checked."""
    status, kind, text, settings = con.execute(
        "SELECT status, load_kind, profile_text, settings FROM runs WHERE run_id = ?",
        [run_id]).fetchone()
    settings = _settings(settings)
    target = float(settings.get("search_target", DEFAULT_TARGET))
    max_err = float(settings.get("search_max_error_rate", DEFAULT_MAX_ERROR_RATE))
    levels = plan_levels(text)
    start = float(settings.get("search_start", 0) or 0)
    search = Bisection(levels, start_position(levels, start))
    off = []
    stages = con.execute("SELECT stage, level FROM stages WHERE run_id = ? AND kind = ? "
                         "AND ended_unix IS NOT NULL ORDER BY stage", [run_id, KIND]).fetchall()
    for stage, level in stages:
        # the nearest level: a rate written to YAML and read back may differ in the last bit
        position = min(range(len(levels)), key=lambda i: abs(levels[i] - float(level)))
        if search.next_position() != position:
            off.append(stage)
        search.record(read_probe(con, run_id, stage, position, level, target, max_err))
    search.next_position()   # sets the stop reason the rules give after the last probe
    sent = con.execute("SELECT count(*) FROM requests WHERE run_id = ? AND "
                       "coalesce(arrival_status, '') <> 'dropped'", [run_id]).fetchone()[0]
    return StoredSearch(run_id, kind, status, target, max_err, levels,
                        levels[search.start] if search.start is not None else None, search,
                        int(sent), off)


def plan_levels(profile_text: str) -> list[float]:
    """The ascending levels of a profile's concurrency or rate plan (its YAML text)."""
    load = (yaml.safe_load(profile_text) or {}).get("load") or {}
    plan = load.get("concurrency") or load.get("rate") or {}
    return sorted(set(float(v) for v in plan.get("levels") or plan.get("rates") or []))


def _settings(value) -> dict:
    if isinstance(value, str):
        import json

        return json.loads(value)
    return dict(value or {})
