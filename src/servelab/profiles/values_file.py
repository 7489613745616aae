"""Numbers read from a CSV or JSONL file: an empirical distribution's ``file``."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from servelab.core import jsonlines
from servelab.profiles import files


def read_values_file(path: Path, column: str | None = None) -> list[float]:
    """Numbers from a CSV (optional header; pick ``column``) or JSONL (numbers or objects) file.

    Raises ValueError naming the file's line when a value is missing or not a number, OSError
    when the file cannot be read or is not a regular file under the size cap.
    """
    path = Path(path)
    text = files.read_text(path)
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        return _read_jsonl(text, column)
    try:
        return _read_csv(text, column)
    except csv.Error as exc:   # a field over csv's size limit, a NUL byte
        raise ValueError(f"not CSV ({exc})") from None


def _number(cell, where: str) -> float:
    try:
        value = float(cell)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {cell!r} is not a finite number")
    return value


def _read_csv(text: str, column: str | None) -> list[float]:
    rows = [(n, r) for n, r in enumerate(csv.reader(text.splitlines()), start=1)
            if r and not r[0].lstrip().startswith("#")]
    if not rows:
        raise ValueError("no rows")
    first_line, first = rows[0]
    try:
        [float(c) for c in first]
        header = None
    except ValueError:
        header = [c.strip() for c in first]
        rows = rows[1:]
    if header is None:
        if column is not None:
            raise ValueError(f"column {column!r} given but the file has no header row")
        if len(first) != 1:
            raise ValueError(f"line {first_line}: {len(first)} columns and no header; "
                             "add a header row and name the column")
        index = 0
    elif column is None:
        if len(header) != 1:
            raise ValueError(f"columns {', '.join(header)}: name one with 'column'")
        index = 0
    elif column in header:
        index = header.index(column)
    else:
        raise ValueError(f"no column {column!r} (columns: {', '.join(header)})")
    values = []
    for n, row in rows:
        if index >= len(row):
            raise ValueError(f"line {n}: missing column {index + 1}")
        values.append(_number(row[index].strip(), f"line {n}"))
    if not values:
        raise ValueError("no values")
    return values


def _read_jsonl(text: str, column: str | None) -> list[float]:
    values = []
    for n, item in jsonlines.numbered(text):
        if isinstance(item, dict):
            if column is None:
                raise ValueError(f"line {n}: an object; name its length field with 'column'")
            if column not in item:
                raise ValueError(f"line {n}: no field {column!r}")
            item = item[column]
        values.append(_number(item, f"line {n}"))
    if not values:
        raise ValueError("no values")
    return values
