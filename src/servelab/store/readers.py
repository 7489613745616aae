"""Reading a results database while a servelab master holds it.

DuckDB lets one process open a file for writing, and then nobody else may open it, not even
read-only. The master that holds the file therefore publishes a sidecar beside it
(``<db>.master.json``, mode 0600: its pid and host, the URL of its JSON API and a random token
for this run) and answers read queries itself; a reader (``analysis.db.open_for_reading``) looks
for the sidecar when the file is locked. Query results travel as JSON with their DuckDB types
kept (``encode_rows`` on the master, ``decode`` on the reader); ``plain`` is the lossy form the
API's own routes answer with (NaN as null, decimals as numbers, timestamps as ISO text).

Every part of it lives in ``store``, below the load generator and the analysis layer that use
it: this module (the sidecar, the typed JSON), ``read_side`` (the master answers), ``read_guard``
(its read-only rule) and ``read_remote`` (the reader's connection).
"""
from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import os
import secrets
import socket
import time
import uuid
from pathlib import Path

SUFFIX = ".master.json"
# DuckDB types whose Python values are JSON as they are (the fast path: no per-value work).
NATIVE = frozenset({"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
                    "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "VARCHAR"})
FLOATS = frozenset({"DOUBLE", "FLOAT"})


# ---- the sidecar ----------------------------------------------------------------------------
def sidecar_path(db) -> Path:
    # The real path: a reader may name the file through a link or a relative path.
    return Path(os.path.realpath(db) + SUFFIX)


def publish(db, url: str, run_id: str) -> dict:
    """Write the sidecar for ``db`` (atomically, readable by this user only); its content."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "url": url,
            "token": secrets.token_urlsafe(32), "db": os.path.realpath(db), "run_id": run_id,
            "published_unix": time.time()}
    path = sidecar_path(db)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(info, f)
    os.replace(tmp, path)
    return info


def withdraw(db, token: str) -> None:
    """Remove the sidecar, if it is still this run's (another master may have replaced it)."""
    path = sidecar_path(db)
    current = _load(path)
    if current is not None and current.get("token") == token:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def find(db) -> dict | None:
    """The live sidecar of ``db``: None when there is none, it cannot be read, or its master is
    dead (a stale one, left by a master that was killed, is ignored)."""
    info = _load(sidecar_path(db))
    if info is None or not all(k in info for k in ("pid", "url", "token")):
        return None
    if info.get("host") == socket.gethostname() and not pid_alive(int(info["pid"])):
        return None
    return info


def _load(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- values on the wire ---------------------------------------------------------------------
# A JSON object in an encoded result is always a tag ({"$kind": payload}): maps and structs
# travel as {"$map": [[key, value], ...]}, so a decoder can never mistake data for a tag.
def encode(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime.datetime):
        return {"$timestamp": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"$time": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {"$interval": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$blob": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"$map": [[encode(k), encode(v)] for k, v in value.items()]}
    return {"$text": str(value)}


def _finite(value):
    return value if value is None or math.isfinite(value) else {"$float": repr(value)}


def encode_rows(rows: list[tuple], types: list[str]) -> list[list]:
    """Rows of a result whose columns have these DuckDB type names, ready for ``json.dumps``."""
    convert = [None if t in NATIVE else _finite if t in FLOATS else encode for t in types]
    if all(c is None for c in convert):
        return [list(r) for r in rows]
    return [[v if c is None else c(v) for c, v in zip(convert, r)] for r in rows]


def _tagged(obj: dict):
    if len(obj) != 1:
        return obj
    (kind, v), = obj.items()
    if kind == "$float":
        return float(v)
    if kind == "$decimal":
        return decimal.Decimal(v)
    if kind == "$timestamp":
        return datetime.datetime.fromisoformat(v)
    if kind == "$date":
        return datetime.date.fromisoformat(v)
    if kind == "$time":
        return datetime.time.fromisoformat(v)
    if kind == "$interval":
        return datetime.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    if kind == "$blob":
        return base64.b64decode(v)
    if kind == "$uuid":
        return uuid.UUID(v)
    if kind == "$map":
        return {tuple(k) if isinstance(k, list) else k: val for k, val in v}
    if kind == "$text":
        return v
    return obj


def decode(text: str | bytes):
    return json.loads(text, object_hook=_tagged)


def plain(value):
    """JSON for people and scripts (``jq``, a notebook): no tags, no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return value
