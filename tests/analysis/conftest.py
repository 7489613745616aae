import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The analysis tests share helper modules (known rows, independent expectations, synthetic runs).
sys.path.insert(0, str(Path(__file__).parent))

from analysis_rows import k1_rows, k2_rows, merge, results_db  # noqa: E402


@pytest.fixture(scope="session")
def known_data():
    return merge(k1_rows(), k2_rows())


@pytest.fixture(scope="session")
def known_db(tmp_path_factory, known_data):
    """A real DuckDB file holding K1 and K2, with the views installed the way a writer installs them."""
    path = tmp_path_factory.mktemp("known") / "servelab.duckdb"
    results_db(path, known_data).close()
    return path


@pytest.fixture()
def known_con(known_db):
    import duckdb

    con = duckdb.connect(str(known_db), read_only=True)
    yield con
    con.close()


@pytest.fixture(scope="session")
def synthetic_db(tmp_path_factory):
    """SYNTHETIC runs (analysis_synthetic.py, not a real server): fp8 twice (repeats), gptq_int4 once
    (flagged generator_saturated), eagle (speculative decoding, some failures) once; one profile."""
    from analysis_synthetic import Variant, synthetic_run

    path = tmp_path_factory.mktemp("synthetic") / "servelab.duckdb"
    fp8 = Variant("fp8", prefill_ms=50, itl_ms=10, batch=8)
    gptq = Variant("gptq_int4", prefill_ms=80, itl_ms=8, batch=12, itl_per_batch=0.3)
    eagle = Variant("eagle", prefill_ms=70, itl_ms=14, spec_tokens=3, failure_rate=0.01)
    results_db(path, merge(
        synthetic_run("syn-fp8-a", fp8, seed=1, start=1_710_000_000.0),
        synthetic_run("syn-fp8-b", fp8, seed=2, start=1_710_001_000.0),
        synthetic_run("syn-gptq", gptq, seed=3, start=1_710_002_000.0, flags=["generator_saturated"]),
        synthetic_run("syn-eagle", eagle, seed=4, start=1_710_003_000.0),
    )).close()
    return path


@pytest.fixture()
def cli(monkeypatch):
    """servelab's real entry point with only the analysis commands registered (the other command
    families are other areas' and need not import here)."""
    from servelab import cli as cli_module

    monkeypatch.setattr(cli_module, "COMMAND_MODULES", ["servelab.commands.analysis"])
    return cli_module.main


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=5000", "--dump-dom"]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("Debian's chromium is not installed (make install-test installs it)")
    return path


def _page_state(page: Path, profile: Path) -> dict[str, str]:
    """Load the page in headless Chromium and read back what its inline script recorded on <body>
    (analysis.report.PAGE_SCRIPT: data-ready, data-images "loaded/total", data-script-errors, ...);
    the whole DOM Chromium built is under the key "dom"."""
    out = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", page.as_uri()],
                         capture_output=True, text=True, timeout=90)
    body = re.search(r"<body([^>]*)>", out.stdout)
    assert body, f"chromium printed no DOM (rc {out.returncode}): {out.stderr[-2000:]}"
    return {**dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1))), "dom": out.stdout}


@pytest.fixture()
def page_state():
    """page_state(html_path, profile_dir) -> the attributes the report's page script set on <body>."""
    return _page_state
