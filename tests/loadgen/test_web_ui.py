"""The locustfile under Locust's own web UI: servelab's options in the start form, the profile's
shape started from the UI, the run recorded, and the database free again once it ended."""
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
            for option in ("tag", "variant", "db", "timeout_first_token", "drain_timeout"):
                assert f'"{option}"' in page
            assert '"run_id"' not in page and '"spool_dir"' not in page  # internal options
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
            n = dicts(db, "SELECT count(*) AS n FROM requests")[0]["n"]
            assert n == entry["num_requests"] > 0
        finally:
            proc.stop(30)
