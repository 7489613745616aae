"""An API key reaches the server and appears nowhere in any servelab output: not in the database
(exported to text), the logs, the spool, the status file, the printed summary, nor on any child
process's command line. Without the key every request is a row classified http_401."""
import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen_helpers import ROOT, _env, chat_profile, query, sim, sim_requests

KEY = "sk-servelab-grep-7f3a9c1e5b"
HEADER_SECRET = "hdr-secret-42d8e61"
PASSWORD = "pw-secret-9b1c77"
PROFILE = chat_profile("keyed",
                       "A short closed loop against a server that asks for an API key.",
                       (20, 40), (8, 16), 2, "2s", seed=3)


def _cmdlines() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("latin-1"))
            except OSError:
                pass
    return out


def _run(tmp_path, name, *args, env_extra=None):
    """`servelab run` in a child, its /proc command lines sampled while it runs."""
    res_dir = tmp_path / name
    profile = tmp_path / "keyed.yaml"
    profile.write_text(PROFILE)
    env = dict(_env(), **(env_extra or {}))
    for var in ("OPENAI_API_KEY", "SERVELAB_HEADERS", "VLLM_API_KEY"):
        if var not in (env_extra or {}):
            env.pop(var, None)
    cmd = [sys.executable, "-m", "servelab.cli", "run", "--profile", str(profile),
           "--db", str(res_dir / "servelab.duckdb"), "--spool-dir", str(res_dir / "spool"),
           "--workers", "1", "--quiet", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    seen = []
    while proc.poll() is None:
        # servelab's own children (the test's keyed simulator is `servelab.cli sim`, not one)
        seen += [c for c in _cmdlines() if "locust" in c or "servelab.commands.sim" in c]
        time.sleep(0.2)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err, res_dir, seen


def _export_text(db: Path, dest: Path) -> str:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        con.execute(f"EXPORT DATABASE '{dest}' (FORMAT csv)")
    finally:
        con.close()
    return "\n".join(p.read_text(errors="replace") for p in sorted(dest.rglob("*")) if p.is_file())


def _hits(secrets, texts: dict) -> list[str]:
    return [f"{where}: {s}" for where, text in texts.items() for s in secrets if s in text]


def _all_files(root: Path) -> dict:
    return {str(p): p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_key_reaches_the_server_and_nothing_records_it(tmp_path):
    with sim(tmp_path, "--api-key", KEY) as url:
        code, out, err, res, seen = _run(
            tmp_path, "res", "--target", url,
            env_extra={"OPENAI_API_KEY": KEY, "SERVELAB_HEADERS": f"X-Servelab-Test: {HEADER_SECRET}"})
        served = sim_requests(url)
    assert code == 0, err[-3000:]
    db = res / "servelab.duckdb"
    rows = query(db, "SELECT count(*), count(*) FILTER (WHERE error_kind IS NULL) FROM requests")
    assert rows[0][0] > 0 and rows[0][0] == rows[0][1], rows           # every request succeeded
    assert len(served) >= rows[0][0]                                   # the server saw them
    settings = query(db, "SELECT settings::VARCHAR, model FROM runs")[0]
    assert '"api_key":true' in settings[0].replace(" ", "") and "X-Servelab-Test" in settings[0]
    assert settings[1]                                                  # /v1/models with the key
    secrets = [KEY, HEADER_SECRET]
    texts = dict(_all_files(res), stdout=out, stderr=err,
                 db_text=_export_text(db, tmp_path / "export"))
    texts.update({f"cmdline {i}": c for i, c in enumerate(seen)})
    assert any("locust" in c for c in seen)                             # children were sampled
    assert _hits(secrets, texts) == []


@pytest.mark.slow
def test_without_the_key_every_request_is_http_401_and_url_credentials_stay_hidden(tmp_path):
    with sim(tmp_path, "--api-key", KEY) as url:
        keyed_url = url.replace("http://", f"http://someone:{PASSWORD}@")
        code, out, err, res, seen = _run(tmp_path, "res", "--target", keyed_url,
                                         "--max-error-rate", "1")   # every request fails
    assert code == 0, err[-3000:]
    db = res / "servelab.duckdb"
    kinds = query(db, "SELECT error_kind, count(*), any_value(error_text) FROM requests GROUP BY 1")
    assert [k[0] for k in kinds] == ["http_401"], kinds
    assert '{"error":"Unauthorized"}' in kinds[0][2]
    assert query(db, "SELECT target FROM runs")[0][0] == url           # stored without user:pw
    basic = base64.b64encode(f"someone:{PASSWORD}".encode()).decode()
    texts = dict(_all_files(res), stdout=out, stderr=err,
                 db_text=_export_text(db, tmp_path / "export"))
    texts.update({f"cmdline {i}": c for i, c in enumerate(seen)})
    assert _hits([PASSWORD, basic], texts) == []


@pytest.mark.slow
def test_the_run_s_own_simulator_asks_for_the_key(tmp_path):
    """No --target: the simulator gets the key through VLLM_API_KEY (never its command line)."""
    code, out, err, res, seen = _run(tmp_path, "res", env_extra={"OPENAI_API_KEY": KEY,
                                                                 "VLLM_API_KEY": "other"})
    assert code == 0, err[-3000:]
    db = res / "servelab.duckdb"
    rows = query(db, "SELECT count(*), count(*) FILTER (WHERE error_kind IS NULL) FROM requests")
    assert rows[0][0] > 0 and rows[0][0] == rows[0][1]
    log = (res / "logs").glob("*/sim.log")
    assert any("API key authentication" in p.read_text() for p in log)
    texts = dict(_all_files(res), stdout=out, stderr=err,
                 db_text=_export_text(db, tmp_path / "export"))
    texts.update({f"cmdline {i}": c for i, c in enumerate(seen)})
    assert _hits([KEY], texts) == []
    assert os.environ.get("OPENAI_API_KEY") != KEY


@pytest.mark.slow
def test_key_typed_in_the_web_ui(tmp_path):
    import json
    import urllib.parse
    import urllib.request

    from servelab.core import procs

    db, port = tmp_path / "res" / "servelab.duckdb", procs.free_port()
    db.parent.mkdir()
    profile = tmp_path / "keyed.yaml"
    profile.write_text(PROFILE)
    env = {k: v for k, v in _env().items() if k not in ("OPENAI_API_KEY", "SERVELAB_HEADERS")}
    with sim(tmp_path, "--api-key", KEY) as url:
        proc = procs.spawn("locust web UI", [
            sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
            "--host", url, "--profile", str(profile), "--db", str(db),
            "--spool-dir", str(tmp_path / "res" / "spool"), "--web-host", "127.0.0.1",
            "--web-port", str(port)], tmp_path / "res" / "ui.log", env=env, cwd=ROOT)
        base = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(base + "/", 30)
            page = urllib.request.urlopen(base + "/", timeout=2).read().decode()
            assert '"api_key"' in page and '"is_secret": true' in page.replace('":true', '": true')
            form = urllib.parse.urlencode({"user_count": 1, "spawn_rate": 1, "host": url,
                                           "profile": str(profile), "api_key": KEY}).encode()
            assert json.loads(urllib.request.urlopen(base + "/swarm", data=form).read())["success"]
            deadline = time.monotonic() + 60
            while json.loads(urllib.request.urlopen(base + "/stats/requests").read())[
                    "state"] != "stopped":
                assert time.monotonic() < deadline
                time.sleep(0.5)
            page_after = urllib.request.urlopen(base + "/", timeout=2).read().decode()
        finally:
            proc.stop(30)
    rows = query(db, "SELECT count(*), count(*) FILTER (WHERE error_kind IS NULL) FROM requests")
    assert rows[0][0] > 0 and rows[0][0] == rows[0][1], rows
    texts = dict(_all_files(tmp_path / "res"), page=page_after,
                 db_text=_export_text(db, tmp_path / "export"))
    assert _hits([KEY], texts) == []
