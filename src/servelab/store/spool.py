"""A worker's spool: append-only local files written before anything is shipped to the master.

Layout: ``SPOOL_ROOT/RUN_ID/WORKER/`` holding

- ``meta.json``: run id, worker name, host, pid, start time;
- ``requests.ndjson``: one request row per line (orjson), in completion order;
- ``health.ndjson``: one client_health row per line;
- ``started.bin``: the ``worker_seq`` of every request the moment it is sent (8 bytes each).

Every write is one ``os.write`` on an ``O_APPEND`` descriptor: a few microseconds, no user-space
buffer, so a worker killed with SIGKILL leaves every row it had finished on disk. After such a
kill, ``started`` minus the spooled rows is exactly the set of requests that were in flight.

Run ids and worker names become folder names, so every path that takes one (``servelab run``,
Locust's ``--run-id``, a worker's RUN message, a spool's meta.json on ingest) checks it with
``check_id``, and the spool folder must resolve inside the spool root.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from servelab.core.errors import ServelabError

REQUESTS = "requests.ndjson"
HEALTH = "health.ndjson"
STARTED = "started.bin"
META = "meta.json"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND
ID = re.compile(r"[A-Za-z0-9._-]{1,100}")
ID_RULE = "use 1-100 letters, digits, '.', '_' or '-' (not '.' or '..')"


def check_id(value, what: str = "--run-id") -> str:
    """``value`` if it is a safe run id or worker name (one path component), else a
    ServelabError naming ``what`` (the flag or file it came from)."""
    if not isinstance(value, str) or not ID.fullmatch(value) or value in (".", ".."):
        raise ServelabError(f"{what} {value!r}: {ID_RULE}")
    return value


def spool_dir(root, run_id: str, worker: str) -> Path:
    """``root/run_id/worker``, checked to stay inside ``root`` (a symlink out of it is refused)."""
    check_id(run_id, "run id")
    check_id(worker, "worker name")
    base = Path(root).resolve()
    path = (base / run_id / worker).resolve()
    if not path.is_relative_to(base):
        raise ServelabError(f"spool folder {path} is outside --spool-dir {base} (a symlink "
                            "under it?); remove the link or pick another --spool-dir")
    return path


class Spool:
    def __init__(self, root, run_id: str, worker: str):
        self.dir = spool_dir(root, run_id, worker)
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"run_id": run_id, "worker": worker, "host": socket.gethostname(),
                "pid": os.getpid(), "started_unix": time.time()}
        (self.dir / META).write_text(json.dumps(meta))
        self._fds = {name: os.open(self.dir / name, _FLAGS, 0o644)
                     for name in (REQUESTS, HEALTH, STARTED)}
        self.closed = False

    def started(self, seq: int) -> None:
        self._write(STARTED, seq.to_bytes(8, "little"))

    def request(self, line: bytes) -> None:
        self._write(REQUESTS, line)

    def health(self, line: bytes) -> None:
        self._write(HEALTH, line)

    def _write(self, name: str, data: bytes) -> None:
        if not self.closed:
            os.write(self._fds[name], data)
            return
        # A request that finishes after the spool was closed (a worker stopped by a signal)
        # still lands in the file; a closed descriptor's number may already be another file's.
        fd = os.open(self.dir / name, _FLAGS, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in self._fds.values():
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
    if not isinstance(meta, dict):
        raise ServelabError(f"{path / META}: not a JSON object; this is no servelab spool")
    check_id(meta.get("run_id"), f"{path / META}: run_id")
    check_id(meta.get("worker"), f"{path / META}: worker")
    out = SpoolContents(path, meta)
    out.requests, torn_r = _lines(path / REQUESTS)
    out.health, torn_h = _lines(path / HEALTH)
    out.torn = torn_r + torn_h
    rows = []
    for line in out.requests:
        seq = orjson.loads(line).get("worker_seq")
        if type(seq) is int:
            out.seqs.add(seq)
            rows.append(line)
        else:
            out.torn += 1   # no worker_seq: no row of this worker's, whatever else it holds
    out.requests = rows
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
