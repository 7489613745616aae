"""`servelab report` on SYNTHETIC runs (analysis_synthetic.py; test_report_e2e.py does the same on a
real simulator run): the HTML and PNGs are written, the page is self-contained, and headless
Chromium (the page_state fixture, conftest.py) loads every image with no script error."""
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the figures take ~4 s to draw, Chromium ~2 s to load them

@pytest.fixture(scope="module")
def report_dir(synthetic_db, tmp_path_factory):
    from servelab import cli as cli_module

    out = tmp_path_factory.mktemp("report")
    old = cli_module.COMMAND_MODULES
    cli_module.COMMAND_MODULES = ["servelab.commands.analysis"]
    try:
        assert cli_module.main(["report", "syn-fp8-a", "syn-gptq", "syn-eagle", "--db", str(synthetic_db),
                                "--out", str(out), "--boot", "60"]) == 0
    finally:
        cli_module.COMMAND_MODULES = old
    return out


def test_report_files_and_content(report_dir):
    pngs = sorted(p.name for p in report_dir.glob("*.png"))
    assert pngs == ["cdf_overlay.png", "latency_vs_load.png", "pareto.png", "slo_attainment_vs_load.png",
                    "throughput_vs_load.png", "timeline_1.png", "timeline_2.png", "timeline_3.png"]
    for name in pngs:
        data = (report_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    html = (report_dir / "report.html").read_text()
    # self-contained: every image is embedded, nothing is fetched from anywhere
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', html)) == len(pngs)
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<link" not in html
    # flags are shown, and the verdict says plainly that no variant wins everything
    assert '<span class="flag">generator_saturated</span>' in html
    assert "no variant wins every metric" in html
    assert "itl_tokens" in html and "Goodput" in html


def test_report_opens_in_chromium(report_dir, tmp_path, page_state):
    state = page_state(report_dir / "report.html", tmp_path / "profile")
    assert state["ready"] == "yes"
    assert state["images"] == "8/8"
    assert state["script-errors"] == "0" and state["resource-errors"] == "0", state.get("error-text")
    dom = state["dom"]
    # The headline is the SLO frontier at 95%, naming the variant that sustains the most load, and
    # it comes before every figure.
    headline = re.search(r'<div class="headline" id="headline">(.*?)</div>', dom, re.S).group(1)
    assert "target 95%" in headline and "sustains" in headline, headline
    assert dom.index('id="headline"') < dom.index("<figure")
    assert re.search(r'<section id="frontier" data-target="0.95">', dom)
    # Load axes are log2 (the figures say what their drawn axes are) ...
    for name in ("throughput_vs_load", "latency_vs_load", "slo_attainment_vs_load"):
        assert re.search(rf'<figure data-figure="{name}"[^>]*data-xscale="log2"', dom), name
    # ... and the CDFs overlay all three variants on one axis per shared load level.
    cdf = re.search(r'<figure data-figure="cdf_overlay"([^>]*)>', dom).group(1)
    assert 'data-overlaid="3"' in cdf and 'data-levels="[1.0, 4.0, 16.0]"' in cdf, cdf
    # every figure has alt text; wide tables hide their extra columns behind a toggle
    assert not re.search(r'<img (?![^>]*alt="[^"]+")', dom)
    assert 'class="more"' in dom and 'class="opt"' in dom
    if os.environ.get("SERVELAB_SCREENSHOTS"):
        _screenshot(report_dir / "report.html")


def _screenshot(page):
    """docs/img/report_*.png: the top of the page (headline, frontier) and the CDF figure, at 1,400 px."""
    from playwright.sync_api import sync_playwright

    docs = Path(__file__).resolve().parents[2] / "docs" / "img"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.goto(page.as_uri())
        tab.screenshot(path=str(docs / "report_headline.png"))
        tab.locator('figure[data-figure="cdf_overlay"]').screenshot(path=str(docs / "report_cdfs.png"))
        browser.close()


def test_page_check_catches_broken_pages(tmp_path, page_state):
    """The check itself can fail: a missing image and a throwing script are both reported."""
    from servelab.analysis.report import PAGE_SCRIPT

    page = tmp_path / "broken.html"
    page.write_text(f"<!DOCTYPE html><html><head><script>{PAGE_SCRIPT}</script></head><body>"
                    f'<img alt="gone" src="missing.png"><script>undefinedFunction();</script></body></html>')
    state = page_state(page, tmp_path / "profile")
    assert state["images"] == "0/1"
    assert state["script-errors"] == "1" and state["resource-errors"] == "1"
    assert "undefinedFunction" in state["error-text"]


def test_run_labels_are_unique():
    from servelab.analysis.report import _labels

    runs = [dict(run_id="r-1", variant="fp8"), dict(run_id="r-2", variant="fp8"), dict(run_id="r-3", variant="gptq"),
            dict(run_id="r-4", variant=None)]
    assert _labels(runs) == {"r-1": "fp8 (r-1)", "r-2": "fp8 (r-2)", "r-3": "gptq", "r-4": "r-4"}
