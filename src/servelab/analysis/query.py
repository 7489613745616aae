"""``servelab sql``: run a query over the results database (views available, read-only) and print
its rows as a table, CSV or JSON.

Read-only means more than the file's own read-only open: DuckDB can ATTACH another file
READ_WRITE, COPY ... TO any path, and read any file (read_text, read_csv, a quoted path), all
from the same connection. The query therefore runs with external access disabled and the
configuration locked (``db.lock_down``), so it sees the results file and nothing else."""
from __future__ import annotations

import csv
import datetime
import decimal
import json
import math
import sys

import duckdb

from servelab.core.errors import ServelabError

from .catalogue import fmt
from .db import lock_down, open_for_reading


def run_sql(db, text: str) -> tuple[list[str], list[tuple]] | None:
    """The column names and rows of `text` over `db`; None for a statement that returns none."""
    con = open_for_reading(db)
    try:
        lock_down(con)
        try:
            cur = con.execute(text)
        except duckdb.Error as exc:
            hint = ""
            text_l = str(exc).lower()
            if "read-only" in text_l:
                hint = " (servelab sql opens the database read-only; write with the duckdb CLI on a copy)"
            elif any(m in text_l for m in ("disabled by configuration", "configuration has been locked",
                                             "disabled through configuration")):
                hint = (" (servelab sql reads only the results database: no ATTACH, COPY TO, "
                        "EXPORT, file readers or settings; use the duckdb CLI on a copy for those)")
            raise ServelabError(f"{exc}{hint}") from exc
        if cur.description is None:
            return None
        return [d[0] for d in cur.description], cur.fetchall()
    finally:
        con.close()


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else "nan"
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def print_rows(names: list[str], rows: list[tuple], form: str = "table") -> None:
    if form == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows(rows)
    elif form == "json":
        print(json.dumps([{n: _jsonable(v) for n, v in zip(names, row)} for row in rows], indent=1))
    else:
        from rich.table import Table

        from .summary import make_console

        table = Table()
        for n in names:
            table.add_column(n)
        for row in rows:
            table.add_row(*[fmt(v, 3) if isinstance(v, float) else ("NULL" if v is None else str(v)) for v in row])
        console = make_console()
        console.print(table)
        console.print(f"{len(rows)} rows")
