"""Keeps the cost model's defaults within 20% of the published H100 Llama-3.1-8B sweep
(median TPOT and output throughput, concurrency 1 to 16); docs/simulator.md has the full table."""
import pytest

from servelab.orchestration.calibrate_published import H100_SWEEP, h100_sweep


@pytest.fixture(scope="module")
def rows():
    return h100_sweep(concurrencies=(1, 4, 16), duration_s=40.0, warmup_s=8.0)


@pytest.mark.parametrize("metric", ["output tok/s", "TPOT p50 ms"])
def test_h100_sweep_within_20_percent(rows, metric):
    checked = [r for r in rows if r.metric == metric]
    assert len(checked) == 3
    for r in checked:
        assert abs(r.error) <= 0.20, f"{r.case}: {metric} predicted {r.predicted:.2f}, measured {r.measured:.2f}"


def test_the_sweep_has_the_measured_shape(rows):
    tput = [r.predicted for r in rows if r.metric == "output tok/s"]
    tpot = [r.predicted for r in rows if r.metric == "TPOT p50 ms"]
    assert tput[0] < tput[1] < tput[2]                       # batching pays off
    assert tpot[0] < tpot[1] < tpot[2]
    assert tpot[2] / tpot[0] > 1.2                           # prefills of 16 users slow decode down
    assert set(H100_SWEEP) >= {1, 4, 16}
