"""Finishing a run's record: warm-up flags, per-worker loss accounting, health flags.

Used by the master when a run ends and by ``servelab ingest`` after it loads a spool, so both
leave the same, consistent record.
"""
from __future__ import annotations

from dataclasses import dataclass

# The generator is flagged when, in any stage, a worker's typical second (the median of its
# 1-second health samples) had a loop-lag p99 above this, or a CPU above CPU_LIMIT.
LOOP_LAG_LIMIT_MS = 5.0
CPU_LIMIT = 90.0


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


def saturation(con, run_id: str) -> list[Saturation]:
    rows = con.execute(
        """
        SELECT h.worker, s.stage,
               median(h.loop_lag_p99_ms) AS lag, median(h.cpu_percent) AS cpu
        FROM client_health h
        JOIN stages s ON s.run_id = h.run_id
             AND h.t_unix >= s.started_unix AND h.t_unix < coalesce(s.ended_unix, 'infinity')
        WHERE h.run_id = ?
        GROUP BY h.worker, s.stage
        HAVING median(h.loop_lag_p99_ms) > ? OR median(h.cpu_percent) > ?
        ORDER BY s.stage, h.worker
        """, [run_id, LOOP_LAG_LIMIT_MS, CPU_LIMIT]).fetchall()
    return [Saturation(w, st, lag, cpu) for w, st, lag, cpu in rows]


def lost_rows(con, run_id: str) -> int:
    row = con.execute(
        "SELECT coalesce(sum(greatest(produced - stored, 0) + coalesce(in_flight_lost, 0)), 0) "
        "FROM run_workers WHERE run_id = ?", [run_id]).fetchone()
    return int(row[0])


def refresh_flags(con, run_id: str) -> list[str]:
    """Recompute the flags this module owns (generator_saturated, rows_lost); keep the others."""
    row = con.execute("SELECT flags FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return []
    owned = {"generator_saturated", "rows_lost"}
    flags = [f for f in (row[0] or []) if f not in owned]
    if saturation(con, run_id):
        flags.append("generator_saturated")
    if lost_rows(con, run_id):
        flags.append("rows_lost")
    con.execute("UPDATE runs SET flags = ? WHERE run_id = ?", [flags, run_id])
    return flags


def finish(con, run_id: str) -> list[str]:
    mark_warmup(con, run_id)
    count_stored(con, run_id)
    return refresh_flags(con, run_id)
