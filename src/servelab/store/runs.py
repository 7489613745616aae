"""Finishing a run's record: warm-up flags, per-worker loss accounting, health flags.

Used by the master when a run ends and by ``servelab ingest`` after it loads a spool, so both
leave the same, consistent record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# A worker is flagged when, in any stage, its typical second (the median of its 1-second health
# samples) had a loop-lag p99 above this, or a CPU above CPU_LIMIT.
LOOP_LAG_LIMIT_MS = 5.0
CPU_LIMIT = 90.0
# Then the cause: a process that used at least OWN_CPU_BUSY % of a core did the work itself
# (generator_saturated: add workers); one below it that waited while the host was busy (any
# HOST_BUSY_* limit reached) lost the cores to other processes (host_busy: a quieter host). Lag
# with neither (a blocking call in the worker) stays generator_saturated.
OWN_CPU_BUSY = 30.0
HOST_BUSY_CPU = 90.0          # host CPU busy, percent of all cores
HOST_BUSY_RUNNABLE = 1.0      # other runnable threads per core
HOST_BUSY_STEAL = 10.0        # percent of the host's time taken by the hypervisor
HOST_BUSY_SWITCHES = 50.0     # this process's involuntary context switches per second
# (host_load_per_core is recorded but not judged: a 1-minute average trails a stage by a minute.)
# A manual stage's level (users really running) against the requests the workers had in flight
# in its measured window: flagged level_mismatch past max(LEVEL_SLACK, LEVEL_TOLERANCE x level)
# (a closed-loop user has one request in flight, none for the instant between two).
LEVEL_TOLERANCE = 0.10
LEVEL_SLACK = 1.0
MISMATCH_NOTE = "level_mismatch: "


def mark_warmup(con, run_id: str) -> None:
    """warmup = sent (or, never sent, scheduled) outside the stage's measured window."""
    con.execute(
        """
        UPDATE requests AS r SET warmup = NOT coalesce(
            coalesce(r.sent_unix, r.scheduled_unix) >= s.measure_start_unix
            AND coalesce(r.sent_unix, r.scheduled_unix) < s.measure_end_unix, false)
        FROM stages AS s
        WHERE r.run_id = ? AND s.run_id = r.run_id AND s.stage = r.stage
        """, [run_id])


def count_stored(con, run_id: str) -> None:
    """run_workers.stored = the rows the table really holds for each worker."""
    con.execute(
        """
        UPDATE run_workers AS w SET stored = coalesce(
            (SELECT count(*) FROM requests r WHERE r.run_id = w.run_id AND r.worker = w.worker), 0)
        WHERE w.run_id = ?
        """, [run_id])


@dataclass
class Saturation:
    worker: str
    stage: int
    loop_lag_p99_ms: float
    cpu_percent: float
    cause: str = "generator"               # "generator" or "host"
    host_cpu_percent: float | None = None
    host_runnable_per_core: float | None = None
    host_steal_percent: float | None = None
    involuntary_switches_per_s: float | None = None


HEALTH_COLUMNS = ("loop_lag_p99_ms", "cpu_percent", "host_cpu_percent", "host_runnable_per_core",
                  "host_steal_percent", "involuntary_switches_per_s")


def saturation_rule_sql(median) -> str:
    """The rule, once, as two SQL columns (saturated, cause) of the health medians; ``median``
    names the expression of a HEALTH_COLUMNS column's median: an aggregate over stored rows
    here, a column of medians the live window computed over its last seconds."""
    host_busy = " OR ".join(f"{median(c)} >= {limit!r}" for c, limit in (
        ("host_cpu_percent", HOST_BUSY_CPU), ("host_runnable_per_core", HOST_BUSY_RUNNABLE),
        ("host_steal_percent", HOST_BUSY_STEAL),
        ("involuntary_switches_per_s", HOST_BUSY_SWITCHES)))
    lag, cpu = median("loop_lag_p99_ms"), median("cpu_percent")
    return (f"coalesce({lag} > {LOOP_LAG_LIMIT_MS!r} OR {cpu} > {CPU_LIMIT!r}, false) "
            "AS saturated, "
            f"CASE WHEN coalesce({cpu}, 0) < {OWN_CPU_BUSY!r} AND ({host_busy}) "
            "THEN 'host' ELSE 'generator' END AS cause")


def saturation(con, run_id: str) -> list[Saturation]:
    """Every (worker, stage) whose typical second was over a limit, with its cause."""
    medians = ", ".join(f"median(h.{c}) AS {c}" for c in HEALTH_COLUMNS)
    rows = con.execute(
        f"""
        SELECT worker, stage, loop_lag_p99_ms, cpu_percent, cause, host_cpu_percent,
               host_runnable_per_core, host_steal_percent, involuntary_switches_per_s
        FROM (
            SELECT h.worker, s.stage, {medians},
                   {saturation_rule_sql(lambda c: f"median(h.{c})")}
            FROM client_health h
            JOIN stages s ON s.run_id = h.run_id
                 AND h.t_unix >= s.started_unix AND h.t_unix < coalesce(s.ended_unix, 'infinity')
            WHERE h.run_id = ?
            GROUP BY h.worker, s.stage)
        WHERE saturated
        ORDER BY stage, worker
        """, [run_id]).fetchall()
    return [Saturation(*row) for row in rows]


def judge_medians(con, medians: list[dict]) -> list[tuple[bool, str]]:
    """``saturation_rule_sql`` on medians held in memory (each a dict over HEALTH_COLUMNS), run
    on ``con`` (the live window's in-memory DuckDB): (saturated, cause) of each, in order.
    Literals, not parameters: binding a parameter costs DuckDB more than planning the query."""
    if not medians:
        return []
    rows = ", ".join("(" + ", ".join([str(i), *(_literal(m.get(c)) for c in HEALTH_COLUMNS)])
                     + ")" for i, m in enumerate(medians))
    return [tuple(r) for r in con.execute(
        f"SELECT {saturation_rule_sql(lambda c: c)} "
        f"FROM (VALUES {rows}) v(i, {', '.join(HEALTH_COLUMNS)}) ORDER BY i").fetchall()]


def _literal(x) -> str:
    if x is None:
        return "NULL::DOUBLE"
    x = float(x)
    return f"{x!r}::DOUBLE" if math.isfinite(x) else f"'{x!r}'::DOUBLE"


@dataclass
class LevelCheck:
    stage: int
    level: float
    in_flight: float    # the sum over workers of each one's median in-flight sample
    samples: int


def level_mismatches(con, run_id: str) -> list[LevelCheck]:
    """Manual stages whose level the generator's in-flight count contradicts. Each worker's
    median is taken on its own (workers sample on their own clocks), then summed. A profile with
    think time between turns keeps users idle on purpose: only too many in flight counts there."""
    rows = con.execute(
        """
        WITH per_worker AS (
            SELECT s.stage, s.level, h.worker, median(h.in_flight) AS m, count(*) AS n
            FROM stages s
            JOIN client_health h ON h.run_id = s.run_id
                 AND h.t_unix >= s.measure_start_unix AND h.t_unix < s.measure_end_unix
            WHERE s.run_id = ? AND s.kind = 'manual' AND h.in_flight IS NOT NULL
            GROUP BY s.stage, s.level, h.worker)
        SELECT stage, level, sum(m), sum(n) FROM per_worker GROUP BY stage, level ORDER BY stage
        """, [run_id]).fetchall()
    text = con.execute("SELECT profile_text FROM runs WHERE run_id = ?", [run_id]).fetchone()
    idles = may_idle(text[0] if text else None)
    return [LevelCheck(stage, level, float(in_flight), int(n))
            for stage, level, in_flight, n in rows if mismatched(level, in_flight, idles)]


def may_idle(profile_text: str | None) -> bool:
    """Users of this profile may wait between turns (it names a think time), so fewer in flight
    than users is no mismatch there. Read from the text: a zero think time only loosens it."""
    return "think_time" in (profile_text or "")


def mismatched(level, in_flight, idles: bool = False) -> bool:
    if level is None or in_flight is None:
        return False
    gap = in_flight - level
    return (gap if idles else abs(gap)) > max(LEVEL_SLACK, LEVEL_TOLERANCE * level)


def _mismatch_notes(con, run_id: str, checks: list[LevelCheck]) -> None:
    """The run's notes name each mismatched stage (recomputed: earlier such notes replaced)."""
    row = con.execute("SELECT notes FROM runs WHERE run_id = ?", [run_id]).fetchone()
    kept = [n for n in (row[0] or "").split("; ") if n and not n.startswith(MISMATCH_NOTE)]
    kept += [f"{MISMATCH_NOTE}stage {c.stage} ran {c.level:g} users but had {c.in_flight:g} "
             f"requests in flight (median of {c.samples} health samples)" for c in checks]
    con.execute("UPDATE runs SET notes = ? WHERE run_id = ?", ["; ".join(kept) or None, run_id])


def lost_rows(con, run_id: str) -> int:
    row = con.execute(
        "SELECT coalesce(sum(greatest(produced - stored, 0) + coalesce(in_flight_lost, 0)), 0) "
        "FROM run_workers WHERE run_id = ?", [run_id]).fetchone()
    return int(row[0])


def error_rate(con, run_id: str) -> float | None:
    """Failed requests over requests sent (Locust's failure ratio), warm-up included; arrivals
    the open loop dropped were never sent and do not count. None: nothing was sent."""
    total, failed = con.execute(
        "SELECT count(*), count(error_kind) FROM requests WHERE run_id = ? AND "
        "coalesce(arrival_status, '') <> 'dropped'", [run_id]).fetchone()
    return failed / total if total else None


def bad_values(con, run_id: str) -> int:
    """Rows whose server-sent values were out of range or of the wrong type (stored as NULL with
    the reason in data_quality), or that were repaired after a batch failed."""
    row = con.execute("SELECT count(*) FROM requests WHERE run_id = ? AND data_quality IS NOT NULL",
                      [run_id]).fetchone()
    return int(row[0])


def refresh_flags(con, run_id: str) -> list[str]:
    """Recompute the flags this module owns (generator_saturated, host_busy, rows_lost,
    bad_values, level_mismatch, no_requests); keep the others."""
    row = con.execute("SELECT flags FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return []
    owned = {"generator_saturated", "host_busy", "rows_lost", "bad_values", "level_mismatch",
             "no_requests"}
    flags = [f for f in (row[0] or []) if f not in owned]
    causes = {s.cause for s in saturation(con, run_id)}
    if "generator" in causes:
        flags.append("generator_saturated")
    if "host" in causes:
        flags.append("host_busy")
    if lost_rows(con, run_id):
        flags.append("rows_lost")
    if bad_values(con, run_id):
        flags.append("bad_values")
    # Nothing measured (every worker refused the run, or the plan sent nothing): a completed
    # run with no rows must not read as a clean one.
    if not con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchone()[0]:
        flags.append("no_requests")
    mismatches = level_mismatches(con, run_id)
    _mismatch_notes(con, run_id, mismatches)
    if mismatches:
        flags.append("level_mismatch")
    con.execute("UPDATE runs SET flags = ? WHERE run_id = ?", [flags, run_id])
    return flags


def finish(con, run_id: str) -> list[str]:
    mark_warmup(con, run_id)
    count_stored(con, run_id)
    return refresh_flags(con, run_id)
