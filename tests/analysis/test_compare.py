"""Comparisons: quantiles that match DuckDB, point estimates that match stage_summary, bootstrap
intervals that separate real differences from run-to-run noise, and plain verdicts."""
import math

import numpy as np
import pytest

from analysis_rows import merge, results_db
from analysis_synthetic import Variant, synthetic_run
from servelab.analysis.bootstrap import Estimator, load_stage
from servelab.analysis.catalogue import COMPARED
from servelab.analysis.compare import compare_groups, groups_for_runs, groups_for_variants
from servelab.analysis.stats import quantile_cont, weighted_quantiles


def test_quantiles_match_numpy_and_expansion():
    rng = np.random.default_rng(7)
    for _ in range(20):
        values = np.sort(rng.lognormal(3, 1, size=rng.integers(1, 40)))
        weights = rng.integers(0, 4, size=values.size)
        weights[rng.integers(0, values.size)] += 1
        expanded = np.repeat(values, weights)
        qs = [0.0, 0.1, 0.5, 0.9, 0.99, 1.0]
        assert weighted_quantiles(values, weights, qs) == pytest.approx(np.quantile(expanded, qs), rel=1e-12)
        assert quantile_cont(expanded, 0.37) == pytest.approx(np.quantile(expanded, 0.37), rel=1e-12)
    # with failures as +inf: interpolating towards inf gives inf, never nan
    values = np.array([1.0, 2.0, 3.0, math.inf])
    assert list(weighted_quantiles(values, np.array([1, 1, 1, 2]), [0.5, 0.6, 0.99])) == [3.0, math.inf, math.inf]
    assert quantile_cont([1.0, 2.0, 3.0, math.inf, math.inf], 0.99) == math.inf


def test_point_estimates_equal_stage_summary(synthetic_db):
    import duckdb

    con = duckdb.connect(str(synthetic_db), read_only=True)
    groups = groups_for_runs(con, ["syn-gptq", "syn-eagle"])
    result = compare_groups(con, groups, boot=30)
    exact = {s.stage: s for s in compare_groups(con, groups, boot=30, exact=True).stages}
    cur = con.execute("SELECT * FROM stage_summary WHERE run_id IN ('syn-gptq', 'syn-eagle') AND class_name = '(all)'")
    names = [d[0] for d in cur.description]
    summary = {(r["run_id"], r["stage"]): r for r in (dict(zip(names, row)) for row in cur.fetchall())}
    for stage in result.stages:
        for label, run_id in (("gptq_int4", "syn-gptq"), ("eagle", "syn-eagle")):
            row = summary[(run_id, stage.stage)]
            # the bootstrap's own estimator, all weights 1, agrees with the view it resamples
            pooled = Estimator(load_stage(con, [run_id], stage.stage, "(all)")).point()
            for m, e in zip(stage.metrics, exact[stage.stage].metrics):
                where = (stage.stage, label, m.metric)
                assert m.values[label] == pytest.approx(row[m.metric], rel=1e-9), where
                # stage_summary's ITL percentiles are sketched (within 1%); the bootstrap's and
                # --exact's are exact
                sketched = m.metric.startswith("itl_p")
                assert pooled[m.metric] == pytest.approx(row[m.metric], rel=0.0100001 if sketched else 1e-9), where
                assert e.values[label] == pytest.approx(pooled[m.metric], rel=1e-9), where
    con.close()


def test_repeats_are_pooled(synthetic_db):
    import duckdb

    con = duckdb.connect(str(synthetic_db), read_only=True)
    groups = groups_for_variants(con, ["fp8", "eagle"])
    assert groups[0].run_ids == ["syn-fp8-a", "syn-fp8-b"]
    result = compare_groups(con, groups, boot=50)
    ttft = [r[0] for r in con.execute("SELECT ttft_ms FROM request_metrics WHERE run_id IN ('syn-fp8-a', 'syn-fp8-b') "
                                      "AND stage = 2 AND measured AND ok").fetchall()]
    stage2 = next(s for s in result.stages if s.stage == 2)
    p99 = next(m for m in stage2.metrics if m.metric == "ttft_p99_ms")
    assert p99.values["fp8"] == pytest.approx(np.quantile(ttft, 0.99))
    window = con.execute("SELECT sum(output_tokens_in_window) / sum(window_s) FROM stage_summary "
                         "WHERE run_id IN ('syn-fp8-a', 'syn-fp8-b') AND stage = 2 AND class_name = '(all)'").fetchone()[0]
    tps = next(m for m in stage2.metrics if m.metric == "output_tokens_per_s")
    assert tps.values["fp8"] == pytest.approx(window)
    assert tps.intervals["fp8"] is not None  # repeats give throughput an interval; a single run does not
    assert tps.intervals["eagle"] is None
    con.close()


def _db(tmp_path, *runs):
    return results_db(tmp_path / "cmp.duckdb", merge(*runs))


def test_dominant_variant_wins_every_metric(tmp_path):
    fast = Variant("fast", prefill_ms=30, itl_ms=5, batch=32)
    slow = Variant("slow", prefill_ms=150, itl_ms=25, batch=4, itl_per_batch=2.0)
    con = _db(tmp_path, synthetic_run("r-fast", fast, levels=(2, 8), seed=1),
              synthetic_run("r-slow", slow, levels=(2, 8), seed=2, start=1_710_100_000.0))
    result = compare_groups(con, groups_for_runs(con, ["r-slow", "r-fast"]), boot=100)
    assert result.verdict == "fast wins every metric at every stage"
    for stage in result.stages:
        assert stage.verdict.startswith("fast wins every metric")
        p50 = next(m for m in stage.metrics if m.metric == "ttft_p50_ms")
        assert p50.winner == "fast" and p50.winner_clear is True and p50.within_noise["fast"] is False
        assert p50.ratios["fast"] < 0.5  # baseline is the first group given: slow


def test_trade_off_is_stated_plainly(tmp_path):
    quick_start = Variant("quick_start", prefill_ms=25, itl_ms=22, batch=16)
    quick_stream = Variant("quick_stream", prefill_ms=200, itl_ms=6, batch=16)
    con = _db(tmp_path, synthetic_run("r-a", quick_start, levels=(4,), seed=1),
              synthetic_run("r-b", quick_stream, levels=(4,), seed=2, start=1_710_100_000.0))
    result = compare_groups(con, groups_for_runs(con, ["r-a", "r-b"]), boot=100)
    verdict = result.stages[0].verdict
    assert verdict.startswith("no variant wins every metric: ")
    parts = dict(part.split(" has ", 1) for part in verdict.split(": ", 1)[1].split(" (a lead")[0].split("; "))
    assert "the lowest p50 TTFT" in parts["quick_start"]
    assert "the lowest p50 ITL" in parts["quick_stream"]
    assert result.verdict.startswith("no variant wins every metric")


def test_same_configuration_differs_only_by_noise(tmp_path):
    v = Variant("same", prefill_ms=60, itl_ms=10, batch=8)
    other = Variant("other", prefill_ms=60, itl_ms=10, batch=8)
    con = _db(tmp_path, synthetic_run("r-1", v, levels=(4,), seed=11),
              synthetic_run("r-2", other, levels=(4,), seed=12, start=1_710_100_000.0))
    result = compare_groups(con, groups_for_runs(con, ["r-1", "r-2"]), boot=300, seed=1)
    flags = {m.metric: m.within_noise["other"] for m in result.stages[0].metrics}
    judged = [flags[k] for k in ("ttft_p50_ms", "itl_p50_ms", "tpot_p50_ms", "e2e_p99_ms")]
    assert sum(judged) >= 3, flags  # same machine, different seeds: (nearly) all inside the noise
    assert [m.name for m in COMPARED] == [m.metric for m in result.stages[0].metrics]


def test_compare_view_baseline_and_noise(synthetic_db):
    import duckdb

    con = duckdb.connect(str(synthetic_db), read_only=True)
    rows = con.execute("SELECT run_id, baseline_run, value, baseline_value, ratio, noise_band, within_noise, repeats "
                       "FROM compare WHERE stage = 2 AND class_name = '(all)' AND metric = 'ttft_p99_ms' "
                       "ORDER BY run_id").fetchall()
    values = {r[0]: r[2] for r in rows}
    band = abs(values["syn-fp8-a"] - values["syn-fp8-b"])
    for run_id, baseline, value, base, ratio, noise_band, within, repeats in rows:
        assert baseline == "syn-fp8-a"  # earliest run of the profile
        assert base == pytest.approx(values["syn-fp8-a"])
        assert ratio == pytest.approx(value / base)
        assert noise_band == pytest.approx(band)
        assert within == (abs(value - base) <= band)
        assert repeats == (2 if run_id.startswith("syn-fp8") else 1)
    con.close()


def test_compare_view_honours_baseline_tag(tmp_path):
    a = synthetic_run("r-a", Variant("a"), levels=(2,), seed=1)
    b = synthetic_run("r-b", Variant("b", prefill_ms=90), levels=(2,), seed=2, start=1_710_100_000.0,
                      tags={"baseline": "true"})
    con = _db(tmp_path, a, b)
    assert {r[0] for r in con.execute("SELECT DISTINCT baseline_run FROM compare").fetchall()} == {"r-b"}
    assert con.execute("SELECT count(*) FROM compare WHERE within_noise IS NOT NULL").fetchone()[0] == 0


def test_runs_of_one_configuration_given_explicitly_are_compared_one_by_one(synthetic_db):
    import duckdb

    con = duckdb.connect(str(synthetic_db), read_only=True)
    groups = groups_for_runs(con, ["syn-fp8-a", "syn-fp8-b"])
    assert [g.run_ids for g in groups] == [["syn-fp8-a"], ["syn-fp8-b"]]
    assert [g.label for g in groups] == ["fp8@syn-fp8-a", "fp8@syn-fp8-b"]
    grouped = groups_for_runs(con, ["syn-fp8-a", "syn-fp8-b", "syn-gptq"])
    assert [(g.label, g.run_ids) for g in grouped] == [("fp8", ["syn-fp8-a", "syn-fp8-b"]), ("gptq_int4", ["syn-gptq"])]
    con.close()


def test_stage_only_one_group_ran_is_not_a_contest(tmp_path):
    con = _db(tmp_path, synthetic_run("r-a", Variant("a"), levels=(2, 8), seed=1),
              synthetic_run("r-b", Variant("b", prefill_ms=90), levels=(2,), seed=2, start=1_710_100_000.0))
    result = compare_groups(con, groups_for_runs(con, ["r-a", "r-b"]), boot=50)
    last = result.stages[1]
    assert last.verdict == "only a has measured requests at this stage; nothing to compare"
    assert all(m.winner is None for m in last.metrics)
    assert "b has no stage 1" in last.notes
