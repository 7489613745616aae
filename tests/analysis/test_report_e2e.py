"""`servelab report` on a REAL simulator run (issue 5): `servelab run` with no --target starts the
simulated vLLM itself and records the smoke profile into a fresh DuckDB file; `servelab report
latest` writes report.html and the PNGs; headless Chromium (page_state, conftest.py) opens the page,
every plot decodes, and no script or resource error is raised. One run, about 15 s."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a real simulator run, about 15 s


def servelab(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVELAB_HOME": str(REPO)}
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_report_of_a_simulator_run_opens_in_chromium(tmp_path, page_state):
    db, out = tmp_path / "e2e.duckdb", tmp_path / "report"
    run = servelab("run", "--profile", str(REPO / "traffic_profiles" / "smoke.yaml"), "--db", str(db),
                   timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = servelab("report", "latest", "--db", str(db), "--out", str(out), timeout=240)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["cdf_overlay.png", "latency_vs_load.png", "pareto.png", "slo_attainment_vs_load.png",
                    "throughput_vs_load.png", "timeline_1.png"]
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    html = (out / "report.html").read_text()
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', html)) == len(pngs)
    # the run's stage table holds measured figures from the simulator, not an empty shell
    assert "smoke" in html and "<h2>Run " in html and "TTFT p50" in html

    state = page_state(out / "report.html", tmp_path / "chromium-profile")
    assert state["ready"] == "yes"
    assert state["images"] == f"{len(pngs)}/{len(pngs)}"
    assert state["script-errors"] == "0" and state["resource-errors"] == "0", state.get("error-text")
