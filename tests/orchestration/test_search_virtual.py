"""The search against a full sweep of the same levels, both in virtual time (``servelab predict``'s
engine, the simulated server's own): the issue's "done when" at a size a test can afford. The
search's answer is within one level of the sweep's SLO frontier (slo_frontier_at, the view the
report reads), on at most 40% of its requests, and seeding it at the prediction takes fewer
probes than a bisection."""
from pathlib import Path

import duckdb
import pytest

from servelab.orchestration.predict import predict
from servelab.orchestration.runner import RunOptions
from servelab.orchestration.search import SearchOptions, search_plan, write_search_profile
from servelab.orchestration.search_virtual import predict_limit
from servelab.profiles import load_profile
from servelab.specs.variants import load_variant

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.slow  # two predictions in virtual time, ~7 s


def test_search_finds_the_sweeps_frontier_on_a_fraction_of_its_requests(tmp_path):
    profile = load_profile(DATA / "search.yaml")
    # 15 s holds: ~110 requests a probe near the limit, enough for decided verdicts
    opt = SearchOptions(RunOptions(profile=profile.path), high=12, hold_s=15.0)
    plan = search_plan(profile, opt)
    assert plan.levels == [float(n) for n in range(1, 13)]
    path = tmp_path / "search_profile.yaml"
    write_search_profile(profile, plan, path)
    variant = load_variant(DATA / "search_server.yaml")

    found = predict_limit(variant, "A10G", path, plan.over, plan.levels, 0.95, 0.5)
    sweep = predict(variant, "A10G", path, tmp_path / "sweep.duckdb")
    con = duckdb.connect(str(tmp_path / "sweep.duckdb"), read_only=True)
    try:
        frontier, first_failing = con.execute(
            "SELECT max_level_meeting_target, first_failing_level FROM slo_frontier_at(0.95) "
            "WHERE run_id = ? AND class_name = '(all)'", [sweep.run_id]).fetchone()
    finally:
        con.close()

    assert sweep.stages == 12 and first_failing == frontier + 1
    assert found.stop == "resolution"
    assert abs(plan.levels.index(found.limit) - plan.levels.index(frontier)) <= 1
    assert found.bisection_requests <= 0.4 * sweep.requests, (found, sweep)
    assert found.seeded_probes < found.bisection_probes
    assert found.seeded_requests < found.bisection_requests
    assert "calibration" in found.cost_model or "built-in" in found.cost_model


def test_an_slo_no_level_meets_is_said_with_the_best_level(tmp_path):
    profile_path = tmp_path / "tight.yaml"
    # 10 ms to the first token: the slow server's prefill alone takes longer, even for one user
    profile_path.write_text((DATA / "search.yaml").read_text().replace("ttft_ms: 250",
                                                                        "ttft_ms: 10"))
    profile = load_profile(profile_path)
    plan = search_plan(profile, SearchOptions(RunOptions(profile=profile_path), high=8))
    path = tmp_path / "search_profile.yaml"
    write_search_profile(profile, plan, path)
    found = predict_limit(load_variant(DATA / "search_server.yaml"), "A10G", path, plan.over,
                          plan.levels, 0.95, 0.5)
    assert found.limit is None and found.stop == "none_meets" and found.start == 0
    assert found.bisection_probes <= 4   # bisection down to the lowest level, 8 levels
