"""Real servers in subprocesses and `servelab run` for the load generator's tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import duckdb

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PROFILES = HERE / "profiles"
# The simulator's fast set-up (0.5B model on an H100): short steps keep runs short.
SIM_ARGS = ["--hardware", "H100", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--max-model-len",
            "4096"]


def _env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_HOME=str(ROOT))


@contextmanager
def server(cmd: list[str], tmp: Path, name: str):
    ready = tmp / f"{name}.ready"
    log = open(tmp / f"{name}.log", "wb")
    proc = subprocess.Popen(cmd + ["--ready-file", str(ready)], stdout=log,
                            stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: "
                                   + (tmp / f"{name}.log").read_text()[-2000:])
            time.sleep(0.05)
        yield ready.read_text().strip()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def sim(tmp: Path, *extra: str):
    return server([sys.executable, "-m", "servelab.cli", "sim", "--port", "0", *SIM_ARGS,
                   *extra], tmp, "sim")


def calibration(tmp: Path, *extra: str, name: str = "calib"):
    return server([sys.executable, "-m", "servelab.loadgen.calibration_server", "--port", "0",
                   *extra], tmp, name)


def servelab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=ROOT)


def start_servelab(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "servelab.cli", *args],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=_env(),
                            cwd=ROOT, start_new_session=True)


def query(db: Path, sql: str, params=None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def dicts(db: Path, sql: str, params=None) -> list[dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()


def sim_requests(url: str) -> list[dict]:
    out, cursor = [], 0
    while True:
        with urllib.request.urlopen(f"{url}/sim/requests?cursor={cursor}", timeout=10) as r:
            page = json.loads(r.read())
        if not page["requests"]:
            return out
        out += page["requests"]
        cursor = page["next_cursor"]


def probe(cases: list[dict], timeout: float = 60) -> list[dict]:
    """Run request cases through servelab's client in a gevent subprocess."""
    res = subprocess.run([sys.executable, str(HERE / "client_probe.py"), json.dumps(cases)],
                         capture_output=True, text=True, timeout=timeout, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
