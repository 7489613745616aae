import sys
from pathlib import Path

import pytest

from servelab.sim.server.server import start_background

# --import-mode=importlib puts no test folder on sys.path; the tests share one helper module.
sys.path.insert(0, str(Path(__file__).parent))
from sim_server_helpers import FAST  # noqa: E402


@pytest.fixture(scope="session")
def sim():
    """The simulator (0.5B model on an H100: ~1.5 ms steps) on a real socket, for the session."""
    with start_background(seed=7, **FAST) as bg:
        yield bg


@pytest.fixture(scope="session")
def spec_sim():
    """Speculative decoding (n-gram, k=4) and data parallelism 2: two engines, spec counters."""
    fast = dict(FAST, serve_args=FAST["serve_args"] + [
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}',
        "--data-parallel-size", "2"])
    with start_background(seed=3, **fast) as bg:
        yield bg
