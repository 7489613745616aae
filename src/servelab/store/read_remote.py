"""A connection to the results database through the master that holds it (a run is on).

``db.open_for_reading`` returns one when the file is locked and a live sidecar says where the
master's JSON API listens (``store.readers``). It does what the analysis code asks of a DuckDB
connection: ``execute(sql, params)`` and ``close()``, and results with ``description``,
``fetchall``, ``fetchone``, ``fetchmany`` and ``fetchnumpy``. Each ``execute`` is one POST to
``/servelab/api/query`` with the run's token; the master runs read statements only (its rule:
``store.read_guard``) and answers with the values' DuckDB types kept.
"""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import duckdb

from servelab.core.errors import ServelabError
from servelab.store import readers

TIMEOUT_S = 180.0   # the master interrupts a query at 120 s; this is only for a master gone mute

# numpy dtypes of DuckDB types, as DuckDB's own fetchnumpy gives them.
_DTYPES = {"BOOLEAN": "bool", "TINYINT": "int8", "SMALLINT": "int16", "INTEGER": "int32",
           "BIGINT": "int64", "UTINYINT": "uint8", "USMALLINT": "uint16", "UINTEGER": "uint32",
           "UBIGINT": "uint64", "HUGEINT": "float64", "FLOAT": "float32", "DOUBLE": "float64",
           "DECIMAL": "float64", "TIMESTAMP": "datetime64[us]", "DATE": "datetime64[us]",
           "INTERVAL": "timedelta64[us]"}
_FILL = {"bool": False}


class MasterGone(ServelabError):
    """The master no longer holds the file (its run ended): open the file directly."""


class RemoteResult:
    def __init__(self, columns: list | None, rows: list[list]):
        self.columns = columns
        self.description = None if columns is None else \
            [(name, type_name, None, None, None, None, None) for name, type_name in columns]
        self._rows = [tuple(r) for r in rows]
        self._at = 0

    def fetchall(self) -> list[tuple]:
        rows, self._at = self._rows[self._at:], len(self._rows)
        return rows

    def fetchone(self) -> tuple | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchmany(self, size: int = 1) -> list[tuple]:
        rows = self._rows[self._at:self._at + size]
        self._at += len(rows)
        return rows

    def fetchnumpy(self) -> dict:
        """Column arrays as DuckDB's fetchnumpy gives them: masked where a value is NULL."""
        import numpy as np

        rows, out = self.fetchall(), {}
        for i, (name, type_name) in enumerate(self.columns or []):
            values = [r[i] for r in rows]
            dtype = _DTYPES.get(type_name.split("(")[0], "object")
            mask = [v is None for v in values]
            if any(mask):
                fill = _FILL.get(dtype, 0 if dtype != "object" else None)
                data = np.array([fill if m else v for v, m in zip(values, mask)], dtype=dtype)
                out[name] = np.ma.masked_array(data, mask=mask)
            else:
                out[name] = np.array(values, dtype=dtype)
        return out


class RemoteConnection:
    remote = True   # db.lock_down: the master applies its own read-only rule

    def __init__(self, info: dict, db):
        self.url = info["url"].rstrip("/")
        self.token = info["token"]
        self.pid = info.get("pid")
        self.db = db

    def execute(self, sql: str, params=None) -> RemoteResult:
        body = json.dumps({"sql": sql, "params": readers.encode(list(params or []))},
                          allow_nan=False).encode()
        req = urllib.request.Request(f"{self.url}/query", data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S,
                                        context=ssl.create_default_context()) as resp:
                answer = readers.decode(resp.read())
        except urllib.error.HTTPError as exc:
            raise self._error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServelabError(
                f"{self.db} is held by a servelab master (pid {self.pid}) whose API at "
                f"{self.url} does not answer ({getattr(exc, 'reason', exc)}); wait for its run "
                "to end, or query a copy of the file (cp it and pass --db COPY)") from None
        return RemoteResult(answer.get("columns"), answer.get("rows") or [])

    def _error(self, exc: urllib.error.HTTPError) -> Exception:
        try:
            answer = json.loads(exc.read() or b"{}")
        except ValueError:
            answer = {}
        kind, message = answer.get("error", ""), answer.get("message") or str(exc)
        if exc.code == 409:
            return MasterGone(f"the run that held {self.db} ended while this command read "
                              "through its master; run the command again (the file is free)")
        if exc.code == 403:
            return ServelabError(f"the master at {self.url} refused this reader: {message}")
        cls = getattr(duckdb, kind, None)
        if isinstance(cls, type) and issubclass(cls, duckdb.Error):
            return cls(message)   # the same error a direct open would have raised
        return ServelabError(f"through the master that holds {self.db}: {message}")

    def close(self) -> None:
        pass   # nothing is held: every query is one request


def connect(db) -> RemoteConnection | None:
    """A connection through the master that holds ``db``, or None when no live master says so."""
    info = readers.find(db)
    return RemoteConnection(info, db) if info is not None else None
