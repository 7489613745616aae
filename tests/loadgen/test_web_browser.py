"""The web UI as a user meets it (issue 10's acceptance): the README command against the simulator,
driven in headless Chromium through Locust's own controls, the results read back from DuckDB and
compared with what the simulator itself saw."""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from browser import chromium, page_on, screenshot
from loadgen_helpers import PROFILES, ROOT, _env, dicts, sim, wait_for
from servelab.core import procs
from servelab.profiles.durations import format_duration
from servelab.profiles.loader import load_profile
from servelab.profiles.planner import RequestPlanner

pytestmark = pytest.mark.slow

README_PROFILE = "traffic_profiles/chat.yaml"
WARMUP_S = 2.0         # the form's "Manual Warmup", so a level is measured soon after it is reached
MEASURE_S = 4.0        # how long each hand-set level is held once its window opens
UI_TIMEOUT_MS = 20_000
# Two short concurrency levels (profiles/ui_plan.yaml says why its replies are short).
SHORT_PLAN = PROFILES / "ui_plan.yaml"


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory):
    # The tests' small model with room for chat.yaml's longest prompts (8000 tokens), on an L4:
    # replies take a second or two, so a user's gap between two requests (its next prompt
    # built, the last one recorded) is a small share of its time and the server's running
    # count sits at the level.
    with sim(tmp_path_factory.mktemp("sim"), "--max-model-len", "16384", "--hardware", "L4") \
            as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@contextmanager
def locust_ui(tmp: Path, url: str, profile: str, *extra: str):
    """The README's command (`locust -f loadtests/locustfile.py --host URL --profile P`), with the
    test's own database, spool folder and port, and any ``extra`` options."""
    port = procs.free_port()
    db = tmp / "ui.duckdb"
    env = _env()
    env.pop("SERVELAB_MODE", None)     # the form's default must be the command's: plan
    proc = procs.spawn("locust web UI", [
        sys.executable, "-m", "locust", "-f", "loadtests/locustfile.py", "--host", url,
        "--profile", profile, "--db", str(db), "--spool-dir", str(tmp / "spool"),
        "--web-port", str(port), *extra], tmp / "locust.log", env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(base + "/", 30)
        yield base, db
    finally:
        proc.stop(30)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


class ServerSamples:
    """The simulator's own running and waiting counts (its vLLM-style /metrics), sampled with
    wall-clock times in a thread while the browser drives the run."""

    def __init__(self, url: str):
        self.url, self.rows = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
                text = r.read().decode()
            values = {}
            for line in text.splitlines():
                for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                    if line.startswith(name):
                        values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            self.rows.append((time.time(), values.get("vllm:num_requests_running"),
                              values.get("vllm:num_requests_waiting")))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def during(self, start: float, end: float) -> tuple[float, float, int]:
        """Median running and waiting counts within [start, end], and the number of samples."""
        rows = [r for r in self.rows if start <= r[0] <= end and r[1] is not None]
        assert rows, f"no /metrics sample of the simulator between {start} and {end}"
        return (statistics.median(r[1] for r in rows), statistics.median(r[2] or 0 for r in rows),
                len(rows))


def read_db(db: Path, sql: str, params=None) -> list[dict]:
    """The query's rows once the master has let go of the file (it holds it while finishing)."""
    def attempt():
        try:
            return dicts(db, sql, params) or None
        except duckdb.IOException:
            return None
    return wait_for(attempt, 60, f"{db} readable with rows for {sql!r}")


def open_start_form(page) -> None:
    page.wait_for_selector("input[name=userCount]", timeout=UI_TIMEOUT_MS)


def expand(page, section: str) -> None:
    """Open one of the form's collapsed sections: "Advanced options" (run time, profile) or
    "Custom parameters" (servelab's options, the mode among them)."""
    button = page.get_by_role("button", name=section)
    if button.get_attribute("aria-expanded") != "true":
        button.click()


def start(page, users: int, spawn_rate: float, **fields: str) -> None:
    """Fill the start form (fields by their input's name) and press START."""
    open_start_form(page)
    page.fill("input[name=userCount]", str(users))
    page.fill("input[name=spawnRate]", str(spawn_rate))
    for name, value in fields.items():
        if name != "host":
            expand(page, "Advanced options" if name == "profile" else "Custom parameters")
        if name == "mode":
            page.select_option("select[name=mode]", value)
        else:
            page.fill(f"input[name={name}]", value)
    page.get_by_role("button", name="Start", exact=True).click()


def form_error(page) -> str:
    """The message of the error alert Locust's form shows for a refused start."""
    alert = page.locator("form [role=alert]")
    alert.first.wait_for(timeout=UI_TIMEOUT_MS)
    return alert.first.inner_text()


def edit_users(page, users: int) -> None:
    """Locust's own Edit dialog of a running test: new user count, Update."""
    page.get_by_role("button", name="Edit", exact=True).click()
    # A modal with the start form's fields ("Edit running load test"), the only form open.
    page.get_by_role("heading", name="Edit running load test").wait_for(timeout=UI_TIMEOUT_MS)
    field = page.locator("input[name=userCount]")
    field.fill(str(users))
    page.get_by_role("button", name="Update", exact=True).click()
    field.wait_for(state="detached", timeout=UI_TIMEOUT_MS)


def users_running(base: str, users: int) -> None:
    """Wait until Locust reports the user count (the UI's own /stats/requests)."""
    wait_for(lambda: get_json(base + "/stats/requests").get("user_count") == users, 30,
             f"{users} users running")


def chart_points(page) -> dict:
    """Points per chart of the LLM tab: its script marks each chart's box with ``data-chart``
    (the chart's name) and ``data-points`` (the non-empty values it plots)."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('[data-chart]')]
        .map(c => [c.dataset.chart, Number(c.dataset.points || 0)]))""")


def llm_tab_has_data(page, started: float, within_s: float) -> dict:
    """Open the LLM tab; every chart's points once they all have some, within ``within_s`` of
    ``started`` (monotonic), else a failed test saying which stayed empty."""
    page.get_by_role("tab", name="LLM").click()
    points: dict = {}
    while time.monotonic() - started <= within_s:
        points = chart_points(page)
        if points and all(points.values()):
            return points
        page.wait_for_timeout(200)
    raise AssertionError(f"LLM tab charts without data {within_s:g} s after START: {points}")


def stats_headers(page) -> str:
    page.get_by_role("tab", name="Statistics").click()
    return " | ".join(page.locator("table th").all_inner_texts())


def stop_run(page, base: str) -> None:
    page.get_by_role("button", name="Stop", exact=True).click()
    wait_for(lambda: get_json(base + "/stats/requests")["state"] == "stopped", 90, "stopped")


def test_manual_ramp_4_8_16_through_the_ui(tmp_path, sim_url, browser):
    with locust_ui(tmp_path, sim_url, README_PROFILE) as (base, db), \
            page_on(browser, base + "/", tmp_path / "browser.log") as page, \
            ServerSamples(sim_url) as server:
        started = time.monotonic()
        start(page, 4, 16, mode="manual", manualWarmup=str(WARMUP_S))
        # The promise: the charts have data within 10 s of START (a 1-2 s refresh).
        points = llm_tab_has_data(page, started, 10.0)
        assert {"ttft", "itl", "tokens", "rates", "load"} <= set(points), points
        users_running(base, 4)
        time.sleep(WARMUP_S + MEASURE_S)
        for users in (8, 16):
            if users == 16:
                # A user who reopens the UI mid-run gets the same charts and a working Edit.
                page.reload()
                llm_tab_has_data(page, time.monotonic(), 10.0)
            edit_users(page, users)
            users_running(base, users)
            time.sleep(WARMUP_S + MEASURE_S)
        # Locust's own table says what its columns hold: E2E times, output tokens.
        headers = stats_headers(page)
        assert "E2E" in headers and "Median (ms)" not in headers, headers
        assert "Average size (bytes)" not in headers and "token" in headers, headers
        page.get_by_role("tab", name="LLM").click()
        page.wait_for_timeout(2000)    # one more refresh: the 16-user level in the charts
        shot = screenshot(page, tmp_path, "llm_tab", for_docs=True)
        stop_run(page, base)

    assert shot.stat().st_size > 10_000
    (run,) = read_db(db, "SELECT run_id, status, flags FROM runs")
    assert run["status"] == "completed"
    assert "level_mismatch" not in (run["flags"] or [])
    stages = read_db(db, "SELECT * FROM stages WHERE run_id = ? ORDER BY stage", [run["run_id"]])
    assert [s["level"] for s in stages] == [4, 8, 16]
    for s in stages:
        assert s["kind"] == "manual"
        assert s["measure_start_unix"] >= s["reached_unix"] + WARMUP_S - 0.01
        running, waiting, n = server.during(s["measure_start_unix"], s["measure_end_unix"])
        # The simulator itself had the level's streams in progress: every user really sent
        # (within the level check's own tolerance, max(1, 10 %): a closed-loop user is briefly
        # between two requests; the old bug sent half the level).
        assert abs(running - s["level"]) <= max(1.0, 0.1 * s["level"]), (s, running, waiting, n)
    # Each level's requests were recorded at that level.
    counts = read_db(db, "SELECT level, count(*) AS n, count(error_kind) AS errors FROM requests "
                         "WHERE NOT warmup GROUP BY level ORDER BY level")
    assert [(c["level"], c["errors"]) for c in counts] == [(4, 0), (8, 0), (16, 0)], counts
    assert all(c["n"] > 0 for c in counts)


def test_plan_mode_shows_the_plan_and_follows_it(tmp_path, sim_url, browser):
    profile = tmp_path / "ui_plan.yaml"
    profile.write_text(SHORT_PLAN.read_text())
    plan = RequestPlanner(load_profile(profile)).stages()
    with locust_ui(tmp_path, sim_url, str(profile)) as (base, db), \
            page_on(browser, base + "/", tmp_path / "browser.log") as page:
        open_start_form(page)
        expand(page, "Custom parameters")
        form = page.locator("form").inner_text()
        # The form says what START runs: the levels and the plan's total time.
        assert "plan" in page.locator("select[name=mode]").input_value()
        assert ", ".join(f"{s.users}" for s in plan) + " users" in form, form
        assert format_duration(sum(s.duration_s for s in plan)) in form, form
        start(page, 1, 1)
        wait_for(lambda: get_json(base + "/stats/requests")["state"] == "stopped", 90,
                 "the plan to run to its end")
    (run,) = read_db(db, "SELECT run_id, status FROM runs")
    assert run["status"] == "completed"
    stages = read_db(db, "SELECT * FROM stages ORDER BY stage")
    assert [(s["kind"], s["level"]) for s in stages] == [(p.kind, p.level) for p in plan]
    for s, p in zip(stages, plan):
        assert s["measure_end_unix"] - s["measure_start_unix"] == pytest.approx(p.hold_s, abs=0.5)


def test_bad_profile_and_unreachable_target_are_shown_in_the_form(tmp_path, sim_url, browser):
    profile = tmp_path / "ui_plan.yaml"
    profile.write_text(SHORT_PLAN.read_text())
    missing = tmp_path / "no_such_profile.yaml"
    dead = f"http://127.0.0.1:{procs.free_port()}"
    with locust_ui(tmp_path, sim_url, str(profile)) as (base, db), \
            page_on(browser, base + "/", tmp_path / "browser.log") as page:
        start(page, 1, 1, profile=str(missing))
        message = form_error(page)
        assert str(missing) in message or missing.name in message, message
        assert get_json(base + "/stats/requests")["state"] == "ready"
        start(page, 1, 1, profile=str(profile), host=dead)
        wait_for(lambda: dead in form_error(page) or None, 20,
                 f"the form's error naming {dead}")
        assert get_json(base + "/stats/requests")["state"] == "ready"
    assert not db.exists() or dicts(db, "SELECT * FROM runs") == []
