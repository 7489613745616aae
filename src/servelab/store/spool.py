"""A worker's spool: append-only local files written before anything is shipped to the master.

Layout: ``SPOOL_ROOT/RUN_ID/WORKER/`` holding

- ``meta.json``: run id, worker name, host, pid, start time;
- ``requests.ndjson``: one request row per line (orjson), in completion order;
- ``health.ndjson``: one client_health row per line;
- ``started.bin``: the ``worker_seq`` of every request the moment it is sent (8 bytes each).

Every write is one ``os.write`` on an ``O_APPEND`` descriptor: a few microseconds, no user-space
buffer, so a worker killed with SIGKILL leaves every row it had finished on disk. After such a
kill, ``started`` minus the spooled rows is exactly the set of requests that were in flight.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

REQUESTS = "requests.ndjson"
HEALTH = "health.ndjson"
STARTED = "started.bin"
META = "meta.json"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND


class Spool:
    def __init__(self, root, run_id: str, worker: str):
        self.dir = Path(root) / run_id / worker
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"run_id": run_id, "worker": worker, "host": socket.gethostname(),
                "pid": os.getpid(), "started_unix": time.time()}
        (self.dir / META).write_text(json.dumps(meta))
        self._requests = os.open(self.dir / REQUESTS, _FLAGS, 0o644)
        self._health = os.open(self.dir / HEALTH, _FLAGS, 0o644)
        self._started = os.open(self.dir / STARTED, _FLAGS, 0o644)

    def started(self, seq: int) -> None:
        os.write(self._started, seq.to_bytes(8, "little"))

    def request(self, line: bytes) -> None:
        os.write(self._requests, line)

    def health(self, line: bytes) -> None:
        os.write(self._health, line)

    def close(self) -> None:
        for fd in (self._requests, self._health, self._started):
            try:
                os.close(fd)
            except OSError:
                pass


@dataclass
class SpoolContents:
    path: Path
    meta: dict
    requests: list[bytes] = field(default_factory=list)   # complete, valid lines
    health: list[bytes] = field(default_factory=list)
    started: set[int] = field(default_factory=set)
    seqs: set[int] = field(default_factory=set)            # worker_seq of the spooled rows
    torn: int = 0     # a last line cut by the kill, or lines that do not parse

    @property
    def in_flight_lost(self) -> int:
        return len(self.started - self.seqs)


def find_spools(path) -> list[Path]:
    """Spool folders under ``path``: the folder itself, a run's folder, or the spool root."""
    path = Path(path)
    if (path / META).is_file():
        return [path]
    found = sorted(p.parent for p in path.glob(f"*/{META}"))
    if not found:
        found = sorted(p.parent for p in path.glob(f"*/*/{META}"))
    return found


def read_spool(path) -> SpoolContents:
    path = Path(path)
    meta = json.loads((path / META).read_text())
    out = SpoolContents(path, meta)
    out.requests, torn_r = _lines(path / REQUESTS)
    out.health, torn_h = _lines(path / HEALTH)
    out.torn = torn_r + torn_h
    for line in out.requests:
        out.seqs.add(orjson.loads(line)["worker_seq"])
    raw = (path / STARTED).read_bytes() if (path / STARTED).exists() else b""
    whole = len(raw) - len(raw) % 8
    out.started = {int.from_bytes(raw[i:i + 8], "little") for i in range(0, whole, 8)}
    return out


def _lines(path: Path) -> tuple[list[bytes], int]:
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    lines, torn = [], 0
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            if isinstance(orjson.loads(line), dict):
                lines.append(line)
                continue
        except orjson.JSONDecodeError:
            pass
        torn += 1
    return lines, torn
