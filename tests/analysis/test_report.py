"""`servelab report` on SYNTHETIC runs (analysis_synthetic.py; test_report_e2e.py does the same on a
real simulator run): the HTML and PNGs are written, the page is self-contained, and headless
Chromium (the page_state fixture, conftest.py) loads every image with no script error."""
import re

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
    assert pngs == ["itl_cdf.png", "latency_vs_load.png", "pareto.png", "throughput_vs_load.png",
                    "timeline_1.png", "timeline_2.png", "timeline_3.png"]
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
    assert state["images"] == "7/7"
    assert state["script-errors"] == "0" and state["resource-errors"] == "0", state.get("error-text")


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
