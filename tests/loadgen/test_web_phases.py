"""The LLM tab shows the server's own engine queue and prefill live (issue 21): a real simulator
sending its OTLP spans to a real Locust master's receiver (``--otlp-port``), the run started in
headless Chromium through Locust's own form; the tab's card and TTFT chart carry the spans'
medians, which lie within what the DuckDB file stores for the run."""
from __future__ import annotations

import time

import pytest

from browser import chromium, page_on, screenshot
from loadgen_helpers import sim, wait_for
from servelab.core import procs
from test_web_browser import SHORT_PLAN, get_json, locust_ui, read_db, start

pytestmark = pytest.mark.slow


def phase_card(page) -> dict:
    return page.evaluate("""() => { const c = document.getElementById('servelab-phases');
        return c ? Object.assign({text: c.innerText, title: c.title}, c.dataset) : {}; }""")


def test_llm_tab_shows_live_queue_and_prefill_from_the_servers_spans(tmp_path):
    otlp = procs.free_port()
    profile = tmp_path / "plan.yaml"
    profile.write_text(SHORT_PLAN.read_text().replace("hold: 2s", "hold: 6s"))
    with sim(tmp_path, "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp}/v1/traces") as url, \
            locust_ui(tmp_path, url, str(profile), "--otlp-port", str(otlp)) as (base, db), \
            chromium() as browser, page_on(browser, base + "/", tmp_path / "browser.log") as page:
        start(page, 1, 1)
        page.get_by_role("tab", name="LLM").click()
        seen: dict = {}
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            seen = phase_card(page)
            if int(seen.get("spans") or 0) >= 3 and seen.get("prefillP50"):
                break
            page.wait_for_timeout(250)
        assert int(seen.get("spans") or 0) >= 3, f"no live spans on the LLM tab: {seen}"
        assert "engine queue / prefill p50 ms" in seen["text"] and "p99" in seen["title"]
        live = get_json(base + "/servelab/api/live")
        assert live["spans"]["total"] >= int(seen["spans"])
        # the TTFT chart draws the prefill median beside the client's TTFT once a point is due
        wait_for(lambda: any(v is not None for v in
                             get_json(base + "/servelab/api/live")["series"]
                             ["span_prefill_p50_ms"]), 20, "a prefill point in the series")
        screenshot(page, tmp_path, "llm_tab_phases")
        wait_for(lambda: get_json(base + "/stats/requests")["state"] == "stopped", 90,
                 "the plan to run to its end")
    (row,) = read_db(db, "SELECT min(1000 * time_in_model_prefill_s) AS lo, "
                         "max(1000 * time_in_model_prefill_s) AS hi, count(*) AS n "
                         "FROM server_spans WHERE request_id IS NOT NULL")
    prefill, queue = float(seen["prefillP50"]), float(seen["queueP50"])
    assert row["n"] >= int(seen["spans"]) and row["lo"] <= prefill <= row["hi"]
    assert queue >= 0
