"""Real servers in subprocesses and `servelab run` for the load generator's tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import duckdb

from servelab.core import procs

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PROFILES = HERE / "profiles"
CALIBRATION_SERVER = ROOT / "bench" / "calibration_server.py"
# The simulator's fast set-up (0.5B model on an H100): short steps keep runs short.
SIM_ARGS = ["--hardware", "H100", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--max-model-len",
            "4096"]


def _env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_HOME=str(ROOT))


@contextmanager
def server(cmd: list[str], tmp: Path, name: str):
    ready = tmp / f"{name}.ready"
    child = procs.spawn(name, cmd + ["--ready-file", str(ready)], tmp / f"{name}.log",
                        env=_env(), ready_file=ready)
    try:
        yield child.wait_ready(60)
    finally:
        child.stop(10)


def sim(tmp: Path, *extra: str):
    return server([sys.executable, "-m", "servelab.cli", "sim", "--port", "0", *SIM_ARGS,
                   *extra], tmp, "sim")


def calibration(tmp: Path, *extra: str, name: str = "calib"):
    return server([sys.executable, str(CALIBRATION_SERVER), "--port", "0", *extra], tmp, name)


def fault_chunk(spec: str, request_id: str, output_tokens: int) -> int:
    """Where the calibration server strikes a request's own fault spec (X-Servelab-Faults)."""
    sys.path.insert(0, str(CALIBRATION_SERVER.parent))
    try:
        from calibration_server import fault_chunk as where
    finally:
        sys.path.remove(str(CALIBRATION_SERVER.parent))
    return where(spec, request_id, output_tokens)


def servelab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=ROOT)


def run_against(url: str, profile: Path, db: Path, *extra: str) -> subprocess.CompletedProcess:
    """`servelab run --profile PROFILE --target URL --db DB --quiet EXTRA...`, which must succeed."""
    res = servelab("run", "--profile", str(profile), "--target", url, "--db", str(db), "--quiet",
                   *extra)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def start_servelab(*args: str, log: Path) -> procs.Child:
    return procs.spawn("servelab", [sys.executable, "-m", "servelab.cli", *args], log,
                       env=_env(), cwd=ROOT)


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
    return json_lines(run_script(HERE / "client_probe.py", json.dumps(cases), timeout=timeout))


def run_script(script: Path, *args: str, timeout: float = 60) -> str:
    """Run a gevent helper script to its end; its output (stdout and stderr)."""
    with tempfile.TemporaryDirectory(prefix="servelab-probe-") as tmp:
        out = Path(tmp) / "out.log"
        child = procs.spawn(script.stem, [sys.executable, str(script), *args], out, env=_env())
        try:
            code = child.wait(timeout)
        finally:
            child.stop(5)
        text = out.read_text()
    assert code == 0, text[-3000:]
    return text


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_status(db: Path) -> dict | None:
    """The live status a run writes beside its database (logs/RUN/status.json); None until there
    is one that reads whole."""
    files = list((db.parent / "logs").glob("*/status.json"))
    try:
        return json.loads(files[0].read_text()) if files else None
    except ValueError:
        return None


def wait_for(pred, timeout: float, what: str):
    """The first truthy value of ``pred()`` within ``timeout`` seconds, else a failed test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out ({timeout:g} s) waiting for {what}")


def chat_profile(name: str, description: str, prompt: tuple[int, int],
                 output: tuple[int, int], users: int, hold: str, seed: int = 5) -> str:
    """A one-class, one-level closed-loop chat profile (the YAML text) for a short test run."""
    return f"""\
name: {name}
description: {description}
endpoint: chat
model: auto
seed: {seed}
classes:
  - name: chat
    prompt_tokens: {{kind: uniform, min: {prompt[0]}, max: {prompt[1]}}}
    output_tokens: {{kind: uniform, min: {output[0]}, max: {output[1]}}}
load:
  concurrency: {{levels: [{users}], warmup: 0s, hold: {hold}}}
"""
