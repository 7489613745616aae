"""The report's "where TTFT goes" panel (issue 21): a stacked bar of the phase medians per load
level, each segment's p99 in its hover text and in the table, drawn from the server's own spans;
a run without spans gets the line saying how to have them. On real vLLM 0.26 spans
(tests/analysis/data/otlp_h200, see its README) and on a real simulator run, opened in headless
Chromium."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.analysis.phases import SEGMENTS
from servelab.analysis.report import build_report

sys.path.insert(0, str(Path(__file__).parent))
from test_request_phases import load, real_rows  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LABELS = [label for _, label in SEGMENTS]


def panel(dom: str) -> str:
    m = re.search(r"<h3>Where TTFT goes</h3>(.*?)(?=<h[23]>)", dom, re.DOTALL)
    assert m, "no 'Where TTFT goes' panel in the page"
    return m.group(1)


def bars(part: str) -> list[dict]:
    """Per bar of the panel's SVG: its level and its segments' hover texts."""
    out = []
    for level, body in re.findall(r'<g class="bar" data-stage="\d+" data-level="([^"]+)">(.*?)</g>',
                                  part, re.DOTALL):
        segs = re.findall(r'<rect class="seg" data-segment="([^"]+)"[^>]*><title>([^<]*)</title>',
                          body)
        out.append({"level": level, "segments": {html.unescape(s): html.unescape(t)
                                                 for s, t in segs}})
    return out


def rendered_segments(page: Path) -> list[float]:
    """The drawn height of each segment as Chromium laid the page out."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.goto(page.as_uri())
            return tab.evaluate("""() => [...document.querySelectorAll('svg.phases rect.seg')]
                .map(r => r.getBoundingClientRect().height)""")
        finally:
            browser.close()


def test_panel_on_real_vllm_spans_opens_in_chromium(tmp_path, page_state):
    con = load(tmp_path, real_rows())
    out = tmp_path / "report"
    report = build_report(con, ["cap_chat"], out, boot=20)
    stages = con.execute("SELECT level, queue_p50_ms, queue_p99_ms, prefill_p50_ms, "
                         "prefill_p99_ms FROM phase_stage_summary WHERE run_id = 'cap_chat' "
                         "AND with_span > 0 ORDER BY stage").fetchall()
    con.close()
    state = page_state(report, tmp_path / "profile")
    assert state["ready"] == "yes"
    assert state["script-errors"] == "0" and state["resource-errors"] == "0", state["error-text"]
    part = panel(state["dom"])
    drawn = bars(part)
    assert [b["level"] for b in drawn] == [f"{s[0]:g}" for s in stages] and len(drawn) >= 4
    for b, (level, q50, q99, p50, p99) in zip(drawn, stages):
        # every phase has its segment, named as the SQL names it, with median and p99 in its hover
        assert list(b["segments"]) == LABELS
        assert f"prefill median {p50:.1f} ms, p99 {p99:.1f} ms" in b["segments"]["prefill"]
        assert f"engine queue median {q50:.1f} ms, p99 {q99:.1f} ms" in b["segments"]["engine queue"]
    # the table carries the same p99s, and what did not join is said (the capture holds a probe)
    assert f"{stages[-1][3]:.1f} / {stages[-1][4]:.1f}" in part
    assert "spans with no request of this run" in part and "span_clock" in part
    heights = rendered_segments(report)
    assert len(heights) == 5 * len(stages) and max(heights) > 50


def test_a_run_without_spans_says_how_to_get_them(synthetic_db, tmp_path):
    import duckdb

    con = duckdb.connect(str(synthetic_db), read_only=True)
    run = con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 1").fetchone()[0]
    text = build_report(con, [run], tmp_path / "r", boot=20).read_text()
    con.close()
    part = panel(text)
    assert 'data-phases="none"' in part and "--otlp-traces-endpoint" in part
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf" in part and "<svg" not in part


@pytest.mark.slow
def test_a_simulator_runs_report_has_the_panel(tmp_path, page_state):
    """`servelab run` on the simulator (its spans to the run's receiver), `servelab report`,
    Chromium: one bar per load level of the smoke profile, five segments each."""
    env = {**os.environ, "SERVELAB_HOME": str(REPO)}
    db, out = tmp_path / "sim.duckdb", tmp_path / "report"
    for args in (["run", "--profile", "traffic_profiles/smoke.yaml", "--db", str(db), "--quiet"],
                 ["report", "latest", "--db", str(db), "--out", str(out)]):
        done = subprocess.run([sys.executable, "-m", "servelab.cli", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    state = page_state(out / "report.html", tmp_path / "profile")
    assert state["ready"] == "yes" and state["script-errors"] == "0", state["error-text"]
    part = panel(state["dom"])
    drawn = bars(part)
    assert [b["level"] for b in drawn] == ["1", "4"]
    assert all(list(b["segments"]) == LABELS for b in drawn)
    assert all("p99" in t for b in drawn for t in b["segments"].values())
    assert "not joined" not in part and "same_host" in part
    assert len(rendered_segments(out / "report.html")) == 10
