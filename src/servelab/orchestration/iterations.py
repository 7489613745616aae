"""The engine's iterations, read from a server log (vLLM's ``--enable-logging-iteration-details``
lines, grammar in ``specs/iteration_log.py``) into ``server_iterations`` after a run.

Where the log comes from: the simulator a run starts (its ``sim.log``), ``--log FILE`` of a run
against ``--target`` (``--backend local`` writes the server's log there), or
``servelab ingest-log --run RUN FILE`` for any saved log (``docker compose logs``, a ``.gz``).

Time: the logger stamps whole seconds in the server's local time with no year. The year is the
run's; the zone offset is the quarter-hour offset that puts most lines inside the run (``UTC`` on
a tie; ``utc_offset_s`` fixes it). Within a second the n lines of that second are spread by their
order: evenly over the second when the engine was busy on both sides of it; at the engine's
typical spacing (the median second's 1/n), packed against the busy neighbour, at the start or
the end of a burst. ``time_error_s`` (0.5) says the estimate is only known to its second. A line
is logged by the API server when the step's outputs arrive, i.e. at the step's end.
"""
from __future__ import annotations

import calendar
import gzip
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.core.quantiles import quantile_cont
from servelab.specs.iteration_log import IterationLine, parse_iteration

_QUARTER_HOUR = 900
_MAX_OFFSET = 14 * 3600
_SLACK_S = 2.0   # lines this close outside the run's window still belong to it (log latency)


@dataclass
class IterationIngest:
    path: str
    lines: int = 0          # iteration lines in the file
    stored: int = 0         # of those, inside the run's window
    outside: int = 0        # outside it (another run's, or idle-time warm-up)
    unstamped: int = 0      # lines without the logger's time stamp (cannot be placed)
    utc_offset_s: int = 0
    engines: int = 0

    def note(self) -> str:
        zone = f"UTC{self.utc_offset_s / 3600:+g}h" if self.utc_offset_s else "UTC"
        text = (f"server_iterations: {self.stored} iteration lines from {Path(self.path).name} "
                f"(log clock read as {zone}, times known to the second)")
        if self.outside:
            text += f", {self.outside} lines outside the run left out"
        if self.unstamped:
            text += f", {self.unstamped} lines without a time stamp left out"
        return text


def read_text(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise ServelabError(f"{path}: no such log file; give the server's saved log (e.g. "
                            f"`docker compose logs --no-color SERVICE > {path.name}`)")
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    return path.read_text(encoding="utf-8", errors="replace")


def parse_lines(text: str) -> list[tuple[int, IterationLine]]:
    """(line number, details) of every iteration line."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        got = parse_iteration(line)
        if got is not None:
            out.append((number, got))
    return out


def _naive_unix(stamp: str, year: int) -> float:
    try:
        return float(calendar.timegm(time.strptime(f"{year}-{stamp}", "%Y-%m-%d %H:%M:%S")))
    except ValueError:   # 02-29 tried in a year without one
        return float("inf")


def stamp_seconds(stamps: list[str], window: tuple[float, float],
                  utc_offset_s: int | None = None) -> tuple[list[float], int]:
    """Unix seconds of the stamps and the zone offset chosen (see the module's docstring)."""
    start, end = window
    year = time.gmtime(start).tm_year
    known: dict[str, float] = {}
    for s in stamps:
        if s not in known:
            # a run over New Year: the stamp's year is the one nearest the run's start
            known[s] = min((_naive_unix(s, y) for y in (year - 1, year, year + 1)),
                           key=lambda t: abs(t - start))
    naive = [known[s] for s in stamps]
    if utc_offset_s is None:
        sample = naive[:: max(1, len(naive) // 2000)]

        def inside(offset: int) -> int:
            return sum(start - _SLACK_S <= t - offset <= end + _SLACK_S for t in sample)

        offsets = sorted(range(-_MAX_OFFSET, _MAX_OFFSET + 1, _QUARTER_HOUR), key=abs)
        utc_offset_s = max(offsets, key=inside)   # max keeps the first (smallest |offset|) tie
    return [t - utc_offset_s for t in naive], utc_offset_s


def spread_in_seconds(seconds: list[float]) -> list[float]:
    """Each line's estimated time, from its second and its place among that second's lines."""
    counts: dict[float, int] = {}
    for s in seconds:
        counts[s] = counts.get(s, 0) + 1
    busy = [1.0 / n for s, n in counts.items() if s - 1 in counts and s + 1 in counts]
    spacing = quantile_cont(busy, 0.5) if busy else None
    out, seen = [], {}
    for s in seconds:
        k = seen.get(s, 0)
        seen[s] = k + 1
        n = counts[s]
        step = min(1.0 / n, spacing) if spacing else 1.0 / n
        before, after = s - 1 in counts, s + 1 in counts
        if before == after and (before or spacing is None):
            out.append(s + (k + 0.5) / n)           # busy throughout (or nothing to go by)
        elif after:
            out.append(s + 1 - (n - k - 0.5) * step)    # a burst starts: packed at the end
        elif before:
            out.append(s + (k + 0.5) * step)            # a burst ends: packed at the start
        else:
            out.append(s + 0.5 + (k - (n - 1) / 2) * step)  # a lone burst: centred
    return out


def iteration_rows(run_id: str, source: str, text: str, window: tuple[float, float],
                   utc_offset_s: int | None = None) -> tuple[list[dict], IterationIngest]:
    report = IterationIngest(source)
    parsed = parse_lines(text)
    report.lines = len(parsed)
    stamped = [(n, it) for n, it in parsed if it.stamp is not None]
    report.unstamped = len(parsed) - len(stamped)
    if not stamped:
        return [], report
    seconds, report.utc_offset_s = stamp_seconds([it.stamp for _, it in stamped], window,
                                                 utc_offset_s)
    times = spread_in_seconds(seconds)
    start, end = window
    rows = []
    for (number, it), second, t in zip(stamped, seconds, times):
        if not start - _SLACK_S <= t <= end + _SLACK_S:
            report.outside += 1
            continue
        rows.append({"run_id": run_id, "source": source, "engine": it.engine,
                     "iteration": it.index, "line_no": number, "log_second_unix": second,
                     "time_unix": t, "time_error_s": 0.5,
                     "context_requests": it.context_requests, "context_tokens": it.context_tokens,
                     "generation_requests": it.generation_requests,
                     "generation_tokens": it.generation_tokens, "elapsed_ms": it.elapsed_ms,
                     "kv_cache_usage_pct": it.kv_cache_usage_pct, "dummy": it.dummy})
    report.stored = len(rows)
    report.engines = len({r["engine"] for r in rows})
    return rows, report


def run_window(con, run_id: str) -> tuple[float, float]:
    row = con.execute("SELECT started_unix, coalesce(finished_unix, (SELECT max(done_unix) FROM "
                      "requests WHERE run_id = ?)) FROM runs WHERE run_id = ?",
                      [run_id, run_id]).fetchone()
    if row is None:
        raise ServelabError(f"--run {run_id}: no such run in the database; `servelab runs` "
                            "lists them")
    start, end = row
    if start is None:
        raise ServelabError(f"--run {run_id}: the run has no start time")
    return float(start), float(end if end is not None else start)


def ingest_iteration_text(con, run_id: str, source: str, text: str,
                          utc_offset_s: int | None = None) -> IterationIngest:
    """Store the run's iteration lines of ``text`` (an earlier ingest of ``source`` replaced)
    and say so in the run's notes when there were any."""
    from servelab.store.telemetry import add_note, replace_rows

    rows, report = iteration_rows(run_id, source, text, run_window(con, run_id), utc_offset_s)
    replace_rows(con, "server_iterations", run_id, source, rows)
    if report.lines:
        add_note(con, run_id, report.note(), "server_iterations: ")
    return report


def ingest_iteration_log(db: str | Path, run_id: str, path: str | Path,
                         utc_offset_s: int | None = None) -> IterationIngest:
    """``servelab ingest-log``: open the database (after the run: it needs the writer's lock)."""
    from servelab.store.db import open_db

    text = read_text(path)
    con = open_db(db)
    try:
        return ingest_iteration_text(con, run_id, str(path), text, utc_offset_s)
    finally:
        con.close()
