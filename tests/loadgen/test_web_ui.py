"""The locustfile under Locust's own web UI: servelab's options in the start form (the plan it
runs described), the profile's shape started from the UI, the run recorded with the profile's
stages, and the database free again once it ended."""
import json
import sys
import time
import urllib.parse
import urllib.request

import pytest

from loadgen_helpers import PROFILES, ROOT, _env, calibration, dicts
from servelab.core import procs

pytestmark = pytest.mark.slow


def test_web_ui_start_form_and_run(tmp_path):
    db = tmp_path / "t.duckdb"
    port = procs.free_port()
    with calibration(tmp_path, "--ttft-ms", "10", "--itl-ms", "3") as url:
        proc = procs.spawn("locust web UI", [
            sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
            "--host", url, "--profile", str(PROFILES / "sessions.yaml"), "--db", str(db),
            "--spool-dir", str(tmp_path / "spool"), "--web-host", "127.0.0.1",
            "--web-port", str(port)], tmp_path / "ui.log", env=_env(), cwd=ROOT)
        base = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(base + "/", 30)
            page = urllib.request.urlopen(base + "/", timeout=2).read().decode()
            for option in ("tag", "variant", "mode", "timeout_first_token", "drain_timeout"):
                assert f'"{option}"' in page
            # internal options, and the database path (the command line's only)
            for option in ("run_id", "spool_dir", "db", "header"):
                assert f'"{option}"' not in page
            assert "plan: 1 concurrency stage at 3 users" in page
            form = urllib.parse.urlencode({"user_count": 1, "spawn_rate": 1, "host": url,
                                           "profile": str(PROFILES / "sessions.yaml"),
                                           "tag": "via=ui"}).encode()
            started = json.loads(urllib.request.urlopen(base + "/swarm", data=form).read())
            assert started["success"] and "ProfileShape" in started["message"]
            deadline = time.monotonic() + 60
            while True:
                stats = json.loads(urllib.request.urlopen(base + "/stats/requests").read())
                if stats["state"] == "stopped":
                    break
                assert time.monotonic() < deadline
                time.sleep(0.5)
            entry = next(s for s in stats["stats"] if s["name"] == "talk")
            # the web UI process is still up, and the database is free to read
            (run,) = dicts(db, "SELECT * FROM runs")
            assert run["status"] == "completed" and run["tags"] == {"via": "ui"}
            # the plan mode: the stages as the profile says, whatever the users fields said
            stages = dicts(db, "SELECT kind, level FROM stages ORDER BY stage")
            assert stages == [{"kind": "concurrency", "level": 3.0}]
            n = dicts(db, "SELECT count(*) AS n FROM requests")[0]["n"]
            assert n == entry["num_requests"] > 0
        finally:
            proc.stop(30)
