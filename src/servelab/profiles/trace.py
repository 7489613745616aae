"""Reading request traces: arrival times with prompt and output lengths.

Two public layouts are understood:
- Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is a
  date-time such as ``2023-11-16 18:15:46.6805900`` (or a number of seconds).
- Mooncake JSONL: one object per line with ``timestamp`` (milliseconds), ``input_length`` and
  ``output_length`` (other fields such as ``hash_ids`` are ignored).

Arrivals are made relative to the earliest row, then multiplied by ``time_scale`` (0.5 replays
twice as fast, 2 half as fast).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from servelab.core import jsonlines
from servelab.profiles import files
from servelab.profiles.limits import MAX_TOKENS

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the line."""


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def detect_format(path: Path, text: str | None = None) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "mooncake"
    if suffix == ".csv":
        return "azure"
    for line in (files.read_text(path) if text is None else text).splitlines():
        if line.strip():
            return "mooncake" if line.lstrip().startswith("{") else "azure"
    raise TraceFormatError("empty file")


def read_trace(path, fmt: str = "auto") -> list[TraceRow]:
    """All rows, sorted by arrival, with arrival_s relative to the earliest row (seconds)."""
    path = Path(path)
    text = files.read_text(path)
    if fmt == "auto":
        fmt = detect_format(path, text)
    try:
        raw = _read_azure(text) if fmt == "azure" else _read_mooncake(text)
    except csv.Error as exc:   # a field over csv's size limit, a NUL byte
        raise TraceFormatError(f"not CSV ({exc})") from None
    if not raw:
        raise TraceFormatError("no rows")
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0]
    return [TraceRow(t - t0, p, o) for t, p, o in raw]


def select_rows(rows: list[TraceRow], time_scale: float = 1.0, start_s: float = 0.0,
                max_duration_s: float | None = None,
                max_requests: int | None = None) -> list[TraceRow]:
    """Rows from ``start_s`` (trace time) on, rescaled and made relative to the first kept row.

    ``max_duration_s`` is in replay time (after scaling); ``max_requests`` keeps the first N.
    """
    kept = [r for r in rows if r.arrival_s >= start_s]
    if not kept:
        return []
    t0 = kept[0].arrival_s
    out = []
    for r in kept:
        at = (r.arrival_s - t0) * time_scale
        if max_duration_s is not None and at >= max_duration_s:
            break
        if max_requests is not None and len(out) >= max_requests:
            break
        out.append(TraceRow(at, r.prompt_tokens, r.output_tokens))
    return out


def _tokens(value, where: str, name: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TraceFormatError(f"{where}: {name} {value!r} is not a number") from None
    if not (math.isfinite(number) and 0 <= number <= MAX_TOKENS and number == int(number)):
        raise TraceFormatError(f"{where}: {name} {value!r} is not a whole number from 0 to "
                               f"{MAX_TOKENS:,}")
    return int(number)


def _finite(seconds: float, where: str, value) -> float:
    if not math.isfinite(seconds):
        raise TraceFormatError(f"{where}: timestamp {value!r} is not a finite number")
    return seconds


def _timestamp(value: str, where: str) -> float:
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return _finite(seconds, where, value)
    # Azure writes 7 fractional digits; datetime takes at most 6.
    head, dot, frac = value.partition(".")
    try:
        stamp = datetime.fromisoformat(head)
    except ValueError:
        raise TraceFormatError(f"{where}: TIMESTAMP {value!r} is not a date-time") from None
    extra = 0.0
    if dot:
        if not frac.isdigit():
            raise TraceFormatError(f"{where}: TIMESTAMP {value!r} is not a date-time")
        extra = int(frac[:9]) / 10 ** len(frac[:9])
    try:
        return stamp.timestamp() + extra
    except (OverflowError, ValueError, OSError):
        raise TraceFormatError(f"{where}: TIMESTAMP {value!r} is out of range") from None


def _read_azure(text: str) -> list[tuple[float, int, int]]:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        return []
    header_line, header = lines[0]
    names = [c.strip() for c in next(csv.reader([header]))]
    missing = [c for c in AZURE_COLUMNS if c not in names]
    if missing:
        raise TraceFormatError(f"line {header_line}: header {','.join(names)} lacks "
                               f"{', '.join(missing)} (expected {','.join(AZURE_COLUMNS)})")
    it, ip, io = (names.index(c) for c in AZURE_COLUMNS)
    rows = []
    for n, line in lines[1:]:
        cells = next(csv.reader([line]))
        where = f"line {n}"
        if len(cells) < len(names):
            raise TraceFormatError(f"{where}: {len(cells)} columns, expected {len(names)}")
        rows.append((_timestamp(cells[it], where), _tokens(cells[ip], where, "ContextTokens"),
                     _tokens(cells[io], where, "GeneratedTokens")))
    return rows


def _read_mooncake(text: str) -> list[tuple[float, int, int]]:
    rows = []
    for n, item in jsonlines.numbered(text, TraceFormatError):
        where = f"line {n}"
        if not isinstance(item, dict):
            raise TraceFormatError(f"{where}: not a JSON object")
        missing = [f for f in MOONCAKE_FIELDS if f not in item]
        if missing:
            raise TraceFormatError(f"{where}: missing {', '.join(missing)}")
        try:
            stamp_ms = float(item["timestamp"])
        except (TypeError, ValueError, OverflowError):
            raise TraceFormatError(f"{where}: timestamp {item['timestamp']!r} is not a number "
                                   "of milliseconds") from None
        rows.append((_finite(stamp_ms / 1000.0, where, item["timestamp"]),
                     _tokens(item["input_length"], where, "input_length"),
                     _tokens(item["output_length"], where, "output_length")))
    return rows
