"""Rows a table refuses: found by splitting the batch, repaired value by value, else set aside.

DuckDB's JSON reader fails a whole batch on one value that does not fit its column (a count of
3e9 for an INTEGER, a string for a number), and a failed statement aborts the transaction it is
in. So a batch that failed is checked here, outside any transaction, on a second connection
(``con.cursor()``) that only stages into a temporary table: halves that load are kept, a half
that fails is split again, down to the single rows that fail. Each such row gets every value
that does not fit its column's type set to NULL, with the reason in ``data_quality`` where the
table has that column; a row that still fails (or is no JSON object) is dropped and counted.
The cost is a few extra parses of a failing batch only; a clean batch never comes here.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import duckdb
import orjson

log = logging.getLogger("servelab.store")
_INT_RANGE = {"TINYINT": 7, "SMALLINT": 15, "INTEGER": 31, "BIGINT": 63}
QUALITY = "data_quality"


@dataclass
class Checked:
    lines: list[bytes] = field(default_factory=list)   # rows that load (some repaired)
    repaired: int = 0      # rows stored with values set to NULL (reason in data_quality)
    dropped: int = 0       # rows that could not be stored at all
    reasons: list[str] = field(default_factory=list)   # the first few, for the log


def check_lines(store, table: str, lines: list[bytes]) -> Checked:
    """The rows of ``lines`` that ``table`` takes, repairing or dropping those it refuses."""
    out = Checked()
    cur = store.con.cursor()
    try:
        _split(store, cur, table, lines, out)
    finally:
        cur.close()
    if out.repaired or out.dropped:
        log.warning("servelab: %s: %d rows stored with values set to NULL, %d rows dropped (%s)",
                    table, out.repaired, out.dropped, "; ".join(out.reasons[:3]))
    return out


def _fits(store, cur, table: str, lines: list[bytes]) -> bool:
    with store.batch_file(b"\n".join(lines)) as path:
        try:
            # materialised: a bare count(*) would let the reader skip converting the columns
            cur.execute(f"CREATE OR REPLACE TEMP TABLE servelab_check AS SELECT * FROM "
                        f"{store.read_json_sql(table, path)}")
            return True
        except duckdb.Error:
            return False
        finally:
            cur.execute("DROP TABLE IF EXISTS servelab_check")


def _split(store, cur, table, lines, out: Checked) -> None:
    # iterative, so a batch of any size never recurses deep
    todo = [lines]
    while todo:
        part = todo.pop()
        if not part:
            continue
        if _fits(store, cur, table, part):
            out.lines += part
        elif len(part) > 1:
            mid = len(part) // 2
            todo += [part[mid:], part[:mid]]
        else:
            fixed = repair(part[0], store._types[table])
            if fixed is not None and _fits(store, cur, table, [fixed[0]]):
                out.lines.append(fixed[0])
                out.repaired += 1
                out.reasons.append(fixed[1])
            else:
                out.dropped += 1
                out.reasons.append("dropped: " + part[0][:120].decode("utf-8", "replace"))


def repair(line: bytes, types: dict[str, str]) -> tuple[bytes, str] | None:
    """``line`` with every value that does not fit its column set to NULL, and why."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            row = json.loads(line)   # the standard parser takes what orjson refuses (1e400)
        except ValueError:
            return None
    if not isinstance(row, dict):
        return None
    reasons = []
    for name, dtype in types.items():
        if name in row and row[name] is not None and not fits(row[name], dtype):
            reasons.append(f"{name}={_short(row[name])} is no {dtype}")
            row[name] = None
    why = "quarantined: " + "; ".join(reasons or ["the row failed to load"])
    if QUALITY in types:
        prior = row.get(QUALITY)
        row[QUALITY] = (why if not isinstance(prior, str) else f"{prior}; {why}")[:500]
    try:
        return orjson.dumps(row), why
    except TypeError:   # an integer beyond 64 bits cannot even be written back
        return None


def fits(v, dtype: str) -> bool:
    if dtype.endswith("[]"):
        return isinstance(v, list) and all(x is None or fits(x, dtype[:-2]) for x in v)
    bits = _INT_RANGE.get(dtype)
    if bits is not None:
        return type(v) is int and -(1 << bits) <= v < (1 << bits)
    if dtype in ("DOUBLE", "FLOAT", "REAL"):
        return type(v) in (int, float)
    if dtype == "VARCHAR":
        return isinstance(v, str)
    if dtype == "BOOLEAN":
        return isinstance(v, bool)
    return True    # JSON, structs, maps: the reader's own business


def _short(v, n: int = 40) -> str:
    return (v if isinstance(v, str) else repr(v))[:n]
