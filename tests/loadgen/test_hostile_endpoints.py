"""Every endpoint servelab reads besides the stream, against the hostile kit's variants
(hostile_endpoints.py) over real sockets: each answer is a named outcome within its deadline,
never a traceback. Outside a run the readers say what came back and what servelab did instead;
inside a real `servelab run` each failed /metrics scrape is an endpoint_events row, the run's
notes and the live view name the outcomes, every request row is stored, and a /metrics that
trickles for 10 s does not slow the client (judged against the kit's own timings)."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from hostile_endpoints import EXPECTED, VARIANTS
from loadgen_helpers import HERE, ROOT, _env, chat_profile, dicts, query, server, wait_for
from servelab.core import timeouts
from servelab.core.errors import ServelabError
from servelab.loadgen.master.scraper import OUTCOMES, QUIRKS, Page, metric_rows
from servelab.store import readers

DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kit")
    with server([sys.executable, str(HERE / "hostile_server.py"), "--port", "0"], tmp,
                "hostile") as url:
        yield url


def _get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


# ---- outside a run: each reader, each variant ----------------------------------------------
def _metrics(base: str) -> tuple[str, str]:
    from servelab.orchestration.serverlog import read_metrics

    text, outcome, detail = read_metrics(base, DEADLINE_S)
    if text is None:
        return outcome, detail
    page, quirks = Page(text), {}
    page.report = lambda t, q: quirks.update({k: n for k, n in q.items() if n})
    metric_rows("probe", 0.0, page)
    return (next(iter(quirks)) if quirks else "ok"), ""


def _models(base: str) -> tuple[str, str]:
    from servelab.profiles.tokens import TokenCountError, resolve_model

    try:
        return ("ok", resolve_model(base, DEADLINE_S, {}))
    except TokenCountError as exc:
        assert exc.endpoint == "/v1/models" and f"({exc.outcome})" in str(exc)
        return exc.outcome, str(exc)


def _tokenize(base: str) -> tuple[str, str]:
    from servelab.profiles.tokens import make_counter

    counter = make_counter(base, "m", timeout=DEADLINE_S, headers={})
    if counter.source == "server":
        return "ok", ""
    # the note names the endpoint, what came back and what counts instead
    assert "/tokenize" in counter.note and "characters per token" in counter.note, counter.note
    assert f"({counter.problem.outcome})" in counter.note
    # ... and it is an endpoint event the worker ships, like a mid-run failure
    assert [(e["endpoint"], e["outcome"]) for e in counter.events] == [
        ("/tokenize", counter.problem.outcome)]
    return counter.problem.outcome, counter.note


def _version(base: str) -> tuple[str, str]:
    from servelab.orchestration.calibrate_probes import ProbeClient

    client = ProbeClient(base, model="m", timeout_s=DEADLINE_S)
    version = client.version()
    if version is not None:
        return "ok", version
    assert "no server version" in client.version_note
    assert f"({client.version_outcome}" in client.version_note, client.version_note
    return client.version_outcome, client.version_note


def _health(base: str) -> tuple[str, str]:
    from servelab.orchestration.backends import probe_health

    return probe_health(base + "/health", DEADLINE_S)


READERS = {"/metrics": _metrics, "/v1/models": _models, "/tokenize": _tokenize,
           "/version": _version, "/health": _health}


def test_every_reader_names_every_hostile_answer_in_time(kit):
    cases = [(ep, v) for ep, vs in VARIANTS.items() for v in vs]

    def one(case):
        ep, variant = case
        t0 = time.monotonic()
        outcome, detail = READERS[ep](f"{kit}/v/{variant}")
        return outcome, detail, time.monotonic() - t0

    # all at once: the slow variants' deadlines overlap instead of adding up
    with ThreadPoolExecutor(len(cases)) as pool:
        got = dict(zip(cases, pool.map(one, cases)))
    wrong = {c: (EXPECTED[c[0]][c[1]], g[0], g[1][:200]) for c, g in got.items()
             if g[0] != EXPECTED[c[0]][c[1]]}
    assert not wrong
    slow = {c: round(g[2], 2) for c, g in got.items() if g[2] > DEADLINE_S + 1.0}
    assert not slow, slow   # a 10 s trickle, 50 MB: each costs its deadline, no more
    named = {"http_<status>" if o.startswith("http_") else o for o in EXPECTED["/metrics"].values()}
    assert named <= set(OUTCOMES)   # the scraper's list names every one


def test_target_check_health_wait_and_mid_run_tokenize(kit, monkeypatch):
    from servelab.orchestration import backends, runner
    from servelab.profiles.tokens import make_counter

    monkeypatch.setattr(timeouts, "HTTP_PROBE_S", DEADLINE_S)
    for variant in ("sane", "html_page", "http_500", "too_large", "truncated"):
        runner.check_target(f"{kit}/v/{variant}")   # any HTTP head: the target is there
    for variant, outcome in (("connection_cut", "connection_reset"), ("slow", "timeout")):
        with pytest.raises(ServelabError, match=rf"GET /v1/models .*\({outcome}: "):
            runner.check_target(f"{kit}/v/{variant}")
    srv = SimpleNamespace(url=f"{kit}/v/http_500", children=[], log_path=None,
                          refresh_log=lambda: None,
                          variant=SimpleNamespace(name="v", kind=SimpleNamespace(
                              health_path="/health")))
    with pytest.raises(ServelabError, match=r"not healthy after 1 s .*\(http_500: HTTP 500"):
        backends.wait_healthy(srv, 1.0)
    # /tokenize answers once, then an HTML page: the counter goes on with the estimate
    counter = make_counter(f"{kit}/v/sane,html_page", "m", timeout=DEADLINE_S, headers={})
    assert counter.source == "server"
    assert counter.count_plain("a few words") == 3   # ceil(11 characters / 4)
    assert counter.source == "estimate" and counter.events[0]["outcome"] == "html_page"
    assert counter.cut(SimpleNamespace(window=lambda start, n: "x" * n), 0, 5) == ("x" * 20, 5)


def test_live_state_and_notes_of_hostile_pages():
    from servelab.loadgen.master.endpoints import EndpointLog
    from servelab.loadgen.master.scraper import server_state

    # braces and '#' in a label, an exemplar, a repeat, NaN/Inf, a cut line, a 10 kB label
    page = ('vllm:num_requests_running{engine="0",model_name="a}b # c"} 3 # {trace="x"} 9\n'
            'vllm:num_requests_running{engine="0",model_name="a}b # c"} 5\n'
            'vllm:num_requests_running{engine="1",model_name="m\\"q"} 2\n'
            'vllm:num_requests_waiting NaN\nvllm:num_requests_waiting{engine="1"} +Inf\n'
            'vllm:num_requests_waiting{engine="2"} 4\nvllm:num_requests_waiting{engine="3" 4\n'
            f'vllm:num_requests_running{{x="{"y" * 10000}"}} 100\n')
    assert server_state(page) == {"running": 5.0, "waiting": 4.0}
    rows = []
    log = EndpointLog("r", rows.append)
    log.ok("/metrics", 1.0)
    log.record("/metrics", "html_page", "HTTP 200, text/html", 2.0)
    log.record("/metrics", "not_prometheus", "ValueError", 1.0, was_ok=True)   # parsed later
    log.quirk("/metrics", "nan_inf_nulled", 2, 3.0)
    log.quirk("/metrics", "nan_inf_nulled", 2, 4.0)      # counted, no second row
    log.record("/v1/models", "http_503", "HTTP 503", 0.5,
               instead="The requests went without a model name")
    assert len(rows) == 4
    m = log.view()["/metrics"]
    assert m["reads"] == 2 and m["counts"] == {"ok": 0, "html_page": 1, "not_prometheus": 1}
    assert m["last_failure"]["outcome"] == "html_page" and m["quirks"] == {"nan_inf_nulled": 2}
    notes = log.notes()
    assert notes[0].startswith("/metrics: 2 scrapes, 0 usable: 1 answered an HTML page "
                               "(html_page), 1 answered text the Prometheus parser refuses "
                               "(not_prometheus). Those seconds have no server metrics")
    assert notes[2] == ("/v1/models: 1 read, 0 usable: 1 answered an error status (http_503). "
                        "The requests went without a model name")
    assert not any("; " in n for n in notes)   # the run's notes are joined with "; "


# ---- inside a run --------------------------------------------------------------------------
ROTATION = ["sane", "html_page", "slow", "json_body", "empty", "too_large", "truncated",
            "http_500", "nan_inf", "wrong_content_type", "not_prometheus", "duplicate_series",
            "openmetrics", "connection_cut"]
FAILED = {EXPECTED["/metrics"][v] for v in ROTATION} - {"ok", *QUIRKS}


def _run(tmp_path, url: str, name: str, hold: str, headers: list[str]) -> tuple:
    profile = tmp_path / f"{name}.yaml"
    profile.write_text(chat_profile(name, "A closed loop against the hostile kit's /metrics.",
                                    (10, 20), (4, 8), 2, hold))
    folder = tmp_path / name
    folder.mkdir()
    db = folder / "r.duckdb"
    cmd = [sys.executable, "-m", "servelab.cli", "run", "--profile", str(profile), "--target",
           url, "--db", str(db), "--spool-dir", str(folder / "spool"), "--quiet"]
    for h in headers:
        cmd += ["--header", h]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), cwd=ROOT)
    return proc, db


def _live(db):
    side = readers.find(db) if db.exists() else None
    if side is None:
        return None
    try:
        view = _get(side["url"] + "/live", side["token"])
    except OSError:
        return None
    metrics = view.get("server", {}).get("endpoints", {}).get("/metrics", {})
    failed = {k for k in metrics.get("counts", {}) if k != "ok"}
    return view if len(failed) >= 4 and "scrape" in view["server"] else None


@pytest.mark.slow
def test_a_run_against_every_hostile_metrics_answer(tmp_path, kit):
    seen_before = _get(f"{kit}/hostile/seen").get("ok", 0)
    proc, db = _run(tmp_path, kit, "rotating", "20s",
                    ["X-Hostile-Metrics: " + ",".join(ROTATION), "X-Hostile-Models: html_page"])
    try:
        view = wait_for(lambda: _live(db), 60, "the live view naming /metrics outcomes")
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    logs = [p for p in (db.parent / "logs").rglob("*") if p.is_file()]
    assert logs, "the run wrote no logs where the test looks"
    for text in [out] + [p.read_text(errors="replace") for p in logs]:
        assert "Traceback" not in text, text[-3000:]
    served = _get(f"{kit}/hostile/endpoints")["/metrics"]
    assert set(ROTATION) <= set(served), served   # the hold covered the whole rotation
    # every request the kit answered is a stored row; the run is not flagged for lost rows
    sent = _get(f"{kit}/hostile/seen").get("ok", 0) - seen_before
    (run,) = dicts(db, "SELECT * FROM runs")
    stored = query(db, "SELECT count(*) FROM requests")[0][0]
    lost = query(db, "SELECT coalesce(sum(in_flight_lost), 0) FROM run_workers")[0][0]
    assert stored + lost == sent and stored > 100, (stored, lost, sent)
    assert run["status"] == "completed" and "rows_lost" not in (run["flags"] or [])
    # each failed scrape a row, each quirk's first page a row, the model list's HTML page too
    events = dicts(db, "SELECT endpoint, outcome, detail FROM endpoint_events")
    named = {e["outcome"] for e in events if e["endpoint"] == "/metrics"}
    assert FAILED | set(QUIRKS) <= named, named
    assert {"/v1/models": "html_page"}.items() <= {e["endpoint"]: e["outcome"]
                                                   for e in events}.items()
    notes = run["notes"]
    for outcome in FAILED | set(QUIRKS):
        assert f"({outcome})" in notes, (outcome, notes)
    assert "no request row was lost" in notes and "/v1/models" in notes
    # the good pages are stored; a repeated series once, OpenMetrics through its own parser
    names = {r[0] for r in query(db, "SELECT DISTINCT name FROM server_metrics")}
    assert {"vllm:num_requests_running", "vllm:generation_tokens_total"} <= names
    dup = query(db, "SELECT max(n) FROM (SELECT count(*) n FROM server_metrics GROUP BY "
                    "t_unix, name, labels)")[0][0]
    assert dup == 1
    metrics = view["server"]["endpoints"]["/metrics"]
    assert metrics["last_failure"]["outcome"] in FAILED and metrics["reads"] >= 4


def _overheads(db, timings: dict) -> list[float]:
    rows = query(db, "SELECT request_id, ttft_ms FROM requests WHERE error_kind IS NULL")
    return [ttft - timings[rid] for rid, ttft in rows if rid in timings]


@pytest.mark.slow
def test_a_slow_metrics_page_does_not_slow_the_client(tmp_path, kit):
    """The client's TTFT less the kit's own (its body read to its first content chunk): the
    same with a /metrics that trickles for 10 s as with a sane one."""
    got = {}
    for name, variant in (("sane", "sane"), ("slow", "slow")):
        proc, db = _run(tmp_path, kit, name, "4s", [f"X-Hostile-Metrics: {variant}"])
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out[-3000:]
        got[name] = _overheads(db, _get(f"{kit}/hostile/timings"))
        got[name + "_events"] = {r[0] for r in query(
            db, "SELECT outcome FROM endpoint_events WHERE endpoint = '/metrics'")}
        # the kit has no /tokenize: each run names that too (prompts counted by the estimate)
        assert query(db, "SELECT DISTINCT endpoint, outcome FROM endpoint_events WHERE "
                         "endpoint <> '/metrics'") == [("/tokenize", "http_404")]
    assert got["slow_events"] == {"timeout"} and got["sane_events"] == set()
    assert len(got["sane"]) > 100 and len(got["slow"]) > 100
    med = {k: statistics.median(got[k]) for k in ("sane", "slow")}
    p90 = {k: statistics.quantiles(got[k], n=10)[-1] for k in ("sane", "slow")}
    assert abs(med["slow"] - med["sane"]) < 2.0, (med, p90)
    assert p90["slow"] - p90["sane"] < 5.0, (med, p90)


# ---- the LLM tab's server panel ------------------------------------------------------------
PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8">
<link rel="stylesheet" href="./servelab/static/llm_tab.css"></head><body>
<div class="MuiTabs-root"><div role="tab" aria-selected="true"><span>LLM</span></div></div>
<script src="./servelab/static/uPlot.iife.min.js"></script>
<script src="./servelab/static/llm_tab.js"></script></body></html>"""


def _view() -> dict:
    """The live view as ``live.view_of`` makes it, for a run whose /metrics answers badly."""
    from servelab.loadgen.master import live
    from servelab.loadgen.master.endpoints import EndpointLog

    t = time.time()
    endpoints = EndpointLog("r")
    endpoints.ok("/metrics", t - 3)
    endpoints.record("/metrics", "timeout", "no complete answer within 2 s", t - 2)
    endpoints.record("/metrics", "html_page", "HTTP 200, text/html, 179 bytes: '<html>'", t - 1)
    endpoints.quirk("/metrics", "nan_inf_nulled", 2, t - 3)
    window = live.LiveWindow()
    window.add_scrape(t - 3, {"running": 2.0, "waiting": 0.0})
    collector = SimpleNamespace(
        stages=SimpleNamespace(by_index={}, current=None), active=True, draining=False,
        run_id="r", live=window, plan_stages=[], scraper=SimpleNamespace(status="html_page"),
        endpoints=endpoints)
    return live.view_of(collector)


@pytest.mark.slow
def test_the_server_panel_names_the_scrape_outcomes(tmp_path):
    from browser import chromium, screenshot

    # the web package's folder, not its module: importing Locust would monkey-patch pytest
    static = ROOT / "src" / "servelab" / "loadgen" / "web" / "static"
    view = json.dumps(_view())

    def serve(route):
        path = route.request.url.split("servelab.test", 1)[1].split("?")[0]
        if path.startswith("/servelab/static/"):
            return route.fulfill(path=str(static / path.rsplit("/", 1)[1]))
        if path == "/servelab/api/live":
            return route.fulfill(body=view, content_type="application/json")
        if path == "/servelab/api/status":
            return route.fulfill(status=404, body="{}")
        return route.fulfill(body=PAGE, content_type="text/html")

    with chromium() as browser:
        context = browser.new_context()
        context.route("http://servelab.test/**", serve)
        page = context.new_page()
        page.goto("http://servelab.test/")
        page.wait_for_selector("#servelab-scrape", timeout=10_000)
        banner = page.inner_text("#servelab-scrape")
        tables = page.inner_text("#servelab-tables")
        cards = page.inner_text("#servelab-cards")
        screenshot(page, tmp_path, "server_panel")
        context.close()
    assert "html_page" in banner and "2 of 3 scrapes unusable" in banner, banner
    assert "Server endpoints" in tables and "timeout × 1" in tables, tables
    assert "html_page × 1" in tables and "nan_inf_nulled × 1" in tables, tables
    assert "html_page\n/metrics" in cards, cards
