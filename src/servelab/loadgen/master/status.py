"""The status file: the master's live progress as one JSON object, rewritten once a second
(``--status-file``; ``servelab run``'s progress line reads it) and a last time at the end."""
from __future__ import annotations

import json
import logging

import gevent

from servelab.core.procs import write_ready_file

log = logging.getLogger("servelab.loadgen")
INTERVAL_S = 1.0


class StatusFile:
    """``snapshot()`` gives the dict to write; nothing is written without a path."""

    def __init__(self, path: str, snapshot):
        self.path = path
        self.snapshot = snapshot
        self._greenlet = gevent.spawn(self._loop) if path else None

    def write(self, **extra) -> None:
        if self.path:
            write_ready_file(self.path, json.dumps(dict(self.snapshot(), **extra)))

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)

    def _loop(self) -> None:
        while True:
            try:
                self.write()
            except OSError as exc:
                log.warning("servelab: status file: %s", exc)
            gevent.sleep(INTERVAL_S)
