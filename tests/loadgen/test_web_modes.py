"""The web UI's two modes and its /swarm guard, over HTTP against one real Locust master, one
worker and the simulator: a hand ramp 4 -> 8 -> 16 stored as three manual stages whose levels
the simulator's own running count agrees with; refusals with their messages; nothing listening
beyond 127.0.0.1 by default; a profile that does not load stops Locust before its form."""
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import duckdb
import psutil
import pytest

from loadgen_helpers import ROOT, _env, chat_profile, dicts, sim, wait_for
from servelab.core import procs

LOCUSTFILE = str(ROOT / "loadtests" / "locustfile.py")


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web_modes")
    profile = tmp / "manual.yaml"
    profile.write_text(chat_profile("manual", "short chat turns for hand ramps", (32, 64),
                                    (200, 300), users=2, hold="2s"))
    port, master_port = procs.free_port(), procs.free_port()
    common = ["-f", LOCUSTFILE, "--profile", str(profile)]
    with sim(tmp, "--max-num-seqs", "64") as url:
        # No --web-host / --master-bind-host: the defaults are under test.
        master = procs.spawn("locust master", [
            sys.executable, "-m", "locust", *common, "--host", url, "--master",
            "--master-bind-port", str(master_port), "--web-port", str(port),
            "--db", str(tmp / "t.duckdb"), "--spool-dir", str(tmp / "spool"),
            "--manual-warmup", "1", "--api-key", "sk-not-in-the-page"], tmp / "master.log",
            env=_env(), cwd=ROOT)
        worker = procs.spawn("locust worker", [
            sys.executable, "-m", "locust", *common, "--worker", "--master-port",
            str(master_port), "--spool-dir", str(tmp / "spool")], tmp / "worker.log",
            env=_env(), cwd=ROOT)
        base = f"http://127.0.0.1:{port}"
        try:
            master.wait_http(base + "/", 60)
            wait_for(lambda: stats(base)["worker_count"] == 1, 60, "the worker")
            yield {"base": base, "url": url, "db": tmp / "t.duckdb", "profile": str(profile),
                   "pid": master.pid, "log": tmp / "master.log"}
        finally:
            worker.stop(30)
            master.stop(30)


def stats(base: str) -> dict:
    return json.loads(urllib.request.urlopen(base + "/stats/requests", timeout=5).read())


def post(base: str, fields: dict, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(base + "/swarm", data=urllib.parse.urlencode(fields).encode(),
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def sim_running(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


@pytest.mark.slow
def test_defaults_bind_localhost_and_the_form_says_the_plan(ui):
    listening = [c.laddr for c in psutil.Process(ui["pid"]).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 2 and {a.ip for a in listening} == {"127.0.0.1"}  # UI + workers
    page = urllib.request.urlopen(ui["base"] + "/", timeout=5).read().decode()
    args = json.loads(page.split("window.templateArgs = ", 1)[1].split("\n", 1)[0])
    extra = args["extra_options"]
    assert "db" not in extra and "spool_dir" not in extra
    assert extra["mode"]["choices"] == ["plan", "manual", "search"]
    assert "1 concurrency stage at 2 users" in extra["mode"]["help_text"]
    assert "ignored" in extra["mode"]["help_text"]
    assert not args["hide_common_options"]   # users and ramp-up are editable
    assert "sk-not-in-the-page" not in page and extra["api_key"]["default_value"] == ""


@pytest.mark.slow
def test_swarm_refusals(ui):
    base, good = ui["base"], {"user_count": 4, "spawn_rate": 4, "host": ui["url"],
                              "mode": "manual"}
    cases = [
        ({"db": "/tmp/elsewhere.duckdb"}, "db cannot be set from the web UI: the database is "
                                          "the command line's"),
        ({"spool_dir": "/tmp/x"}, "spool_dir cannot be set from the web UI"),
        ({"header": "X-A: b"}, "header cannot be set from the web UI"),
        ({"stop_timeout": "3"}, "stop_timeout cannot be set from the web UI: give "
                                "--stop-timeout"),
        ({"profile": "missing/nope.yaml"}, "profile: missing/nope.yaml"),
        ({"host": f"http://127.0.0.1:{procs.free_port()}"}, "does not answer"),
        ({"user_count": "0"}, "user_count: at least 1 user"),
        ({"mode": "turbo"}, "mode: 'turbo' is not a mode"),
        ({"mode": "search", "search_target": "1.5"}, "search_target: '1.5': give the share"),
    ]
    for change, message in cases:
        code, body = post(base, dict(good, **change))
        assert code == 400 and body["success"] is False, (change, body)
        assert message in body["message"], (change, body)
    # Locust's page shows a refused start's message only from a 200 answer
    code, body = post(base, dict(good, db="x"), {"Sec-Fetch-Mode": "cors"})
    assert code == 200 and body["success"] is False and "db cannot" in body["message"]
    assert stats(base)["state"] in ("ready", "stopped")
    # A run that cannot start (its database locked by another writer) leaves the UI up.
    con = duckdb.connect(str(ui["db"]))
    try:
        code, body = post(base, good)
        assert code == 200 and body["success"]
        wait_for(lambda: "lock" in ui["log"].read_text().lower(), 30, "the start's error")
        # the shape's first tick failed: Locust is back at its start form, the process up
        wait_for(lambda: stats(base)["state"] in ("ready", "stopped"), 30, "the start form")
    finally:
        con.close()
    assert psutil.pid_exists(ui["pid"])


@pytest.mark.slow
def test_manual_ramp_4_8_16(ui):
    base, url = ui["base"], ui["url"]
    seen = {}
    for i, users in enumerate((4, 8, 16)):
        form = {"user_count": users, "spawn_rate": 100}
        if i == 0:
            form.update(host=url, mode="manual", profile=ui["profile"])
        code, body = post(base, form)
        assert code == 200 and body["success"], body
        wait_for(lambda: stats(base)["user_count"] == users, 60, f"{users} users")
        if i == 0:   # a page opened mid-run shows what runs, so its Edit form posts that
            page = urllib.request.urlopen(base + "/", timeout=5).read().decode()
            extra = json.loads(page.split("window.templateArgs = ", 1)[1].split("\n", 1)[0])[
                "extra_options"]
            assert extra["mode"]["default_value"] == "manual"
        if i == 1:   # while it runs only the users and ramp-up may change
            code, body = post(base, {"user_count": 8, "spawn_rate": 100, "mode": "plan"})
            assert code == 400 and "mode cannot be changed while a run is on" in body["message"]
        time.sleep(1.5)   # the manual warm-up (1 s), then a share of the window
        samples = []
        for _ in range(8):
            samples.append(sim_running(url))
            time.sleep(0.3)
        seen[users] = statistics.median(samples)
    urllib.request.urlopen(urllib.request.Request(base + "/stop", data=b""), timeout=30)
    wait_for(lambda: stats(base)["state"] == "stopped", 90, "the run to stop")
    runs = dicts(ui["db"], "SELECT * FROM runs WHERE status <> 'running' ORDER BY started_unix")
    run = runs[-1]
    assert json.loads(run["settings"])["mode"] == "manual"
    assert "level_mismatch" not in run["flags"], run["notes"]
    stages = dicts(ui["db"], "SELECT * FROM stages WHERE run_id = ? ORDER BY stage",
                   [run["run_id"]])
    assert [(s["kind"], s["level"]) for s in stages] == [("manual", 4.0), ("manual", 8.0),
                                                        ("manual", 16.0)]
    for s in stages:
        assert s["measure_start_unix"] == pytest.approx(s["reached_unix"] + 1.0)
        assert s["measure_start_unix"] < s["measure_end_unix"] <= s["ended_unix"]
    for level, running in seen.items():   # the server's own count agrees with the level
        assert abs(running - level) <= max(1.0, 0.1 * level), seen
    measured = dicts(ui["db"], "SELECT stage, count(*) AS n FROM requests WHERE run_id = ? "
                     "AND NOT warmup GROUP BY stage ORDER BY stage", [run["run_id"]])
    assert [m["stage"] for m in measured] == [0, 1, 2] and all(m["n"] > 0 for m in measured)


def test_bad_profile_stops_locust_before_the_form(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--profile",
                           str(tmp_path / "nope.yaml"), "--web-port", str(procs.free_port())],
                          capture_output=True, text=True, timeout=60, env=_env(), cwd=ROOT)
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr and "cannot read" in proc.stderr


@pytest.mark.parametrize("think, in_flight, flagged", [
    (False, [4, 4, 3, 4], True),     # 8 asked and running, 4 sending: the old bug
    (False, [8, 7, 8, 8], False),
    (True, [4, 5, 4, 4], False),     # think time between turns: idle users are no mismatch
    (True, [12, 12, 11, 12], True),  # but more in flight than users still is
])
def test_level_mismatch_flag_and_note(tmp_path, think, in_flight, flagged):
    from servelab.store import runs
    from servelab.store.db import open_db

    con = open_db(tmp_path / "f.duckdb")
    text = "load: manual\n" + ("session: {think_time: 2s}\n" if think else "")
    con.execute("INSERT INTO runs (run_id, profile_text, flags, notes) VALUES "
                "('r', ?, ['unverified'], 'kept note')", [text])
    con.execute("INSERT INTO stages VALUES ('r', 0, 'manual', 8, 0, 1, 2, 10, 10)")
    for w in ("w0", "w1"):   # two workers, each half the level
        for i, n in enumerate(in_flight):
            con.execute("INSERT INTO client_health (run_id, worker, t_unix, in_flight) "
                        "VALUES ('r', ?, ?, ?)", [w, 2.5 + i + (0.5 if w == "w1" else 0), n / 2])
    assert ("level_mismatch" in runs.refresh_flags(con, "r")) is flagged
    assert runs.refresh_flags(con, "r").count("level_mismatch") == int(flagged)  # idempotent
    flags, notes = con.execute("SELECT flags, notes FROM runs").fetchone()
    assert "unverified" in flags and notes.startswith("kept note")
    assert notes.count("level_mismatch: stage 0 ran 8 users") == int(flagged)
