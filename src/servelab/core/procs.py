"""One way to run a child process: spawn it in its own process group with its output in a log,
wait for the ready file it writes (or for an HTTP health URL), and stop the whole group.

Every caller uses this: ``servelab run`` (simulator, Locust master and workers), the matrix
backends, the tests and the benches. A child started here never outlives ``stop()``: it is sent
SIGTERM as a group, then SIGKILL after a grace period.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.core.timeouts import STOP_GRACE_S


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_ready_file(path: str | os.PathLike, text: str) -> None:
    """Atomic: a reader sees either no file or the whole line, never half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text.rstrip("\n") + "\n")
    os.replace(tmp, path)


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not Path(path).is_file():
        return ""
    return "\n".join(Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


@dataclass
class Child:
    """A process in its own group, its stdout and stderr going to ``log_path``."""
    name: str
    proc: subprocess.Popen
    log_path: Path | None
    ready_file: Path | None = None
    _log: object = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def send_signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def _failure(self, why: str) -> ServelabError:
        where = f"; its log ({self.log_path}) ends:\n{log_tail(self.log_path)}" if self.log_path else ""
        return ServelabError(f"{self.name} did not start ({why}){where}")

    def wait_ready(self, timeout_s: float) -> str:
        """The ready file's first line (a URL, usually), once the child has written it."""
        assert self.ready_file is not None, "spawn(..., ready_file=...) first"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                text = self.ready_file.read_text().strip()
            except OSError:
                text = ""
            if text:
                return text.splitlines()[0]
            if not self.alive():
                self.close_log()
                raise self._failure(f"exit {self.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise self._failure(f"not ready after {timeout_s:g} s")
            time.sleep(0.05)

    def wait_http(self, url: str, timeout_s: float) -> None:
        """Poll ``url`` until it answers 200; fail early when the child died."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise self._failure(f"exit {self.returncode} before {url} answered")
            if http_ok(url):
                return
            if time.monotonic() > deadline:
                raise self._failure(f"{url} not healthy after {timeout_s:g} s")
            time.sleep(0.2)

    def stop(self, grace_s: float = STOP_GRACE_S, sig: int = signal.SIGTERM) -> int | None:
        """Signal the whole group, wait ``grace_s``, then SIGKILL the group."""
        if self.alive():
            _signal_group(self.proc, sig)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc, signal.SIGKILL)
                self.proc.wait(5)
        # Grandchildren (a Locust worker's helpers, vLLM's engine core) share the group.
        _signal_group(self.proc, signal.SIGKILL)
        self.close_log()
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        return self.proc.returncode

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(name: str, cmd: list[str], log_path: Path | None, *, env: dict | None = None,
          cwd: str | os.PathLike | None = None, ready_file: Path | None = None,
          stdin=subprocess.DEVNULL, parent_death_signal: int | None = None) -> Child:
    """Start ``cmd`` in a new session; with ``ready_file``, the old file is removed first so
    ``wait_ready`` never reads a previous child's URL. ``parent_death_signal`` (Linux): the
    signal the child gets when this process dies, even by SIGKILL, so that no stop() ever
    running leaves no orphan either."""
    if ready_file is not None:
        ready_file = Path(ready_file)
        ready_file.unlink(missing_ok=True)
    handle = open(log_path, "wb") if log_path is not None else subprocess.DEVNULL
    preexec = _death_signal(parent_death_signal) if parent_death_signal else None
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, stdin=stdin,
                            env=env, cwd=cwd, start_new_session=True, preexec_fn=preexec)
    return Child(name, proc, Path(log_path) if log_path else None, ready_file,
                 handle if log_path is not None else None)


def _death_signal(sig: int):
    """A preexec_fn asking the kernel for ``sig`` when the parent dies (prctl PR_SET_PDEATHSIG);
    a no-op where there is no prctl."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(sig), 0, 0, 0)   # PR_SET_PDEATHSIG
        if os.getppid() != parent:    # the parent died before the call: too late to be told
            os.kill(os.getpid(), int(sig))

    return preexec


def http_ok(url: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
