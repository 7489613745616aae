"""Length distributions checked statistically: 10,000 samples against analytic values.

Tolerances: the sample mean within 2% (4% for heavy-tailed lognormals) of the analytic mean;
p50 and p90 within 3%, p99 within 6%, each plus one token for the rounding to whole tokens. With
10,000 samples the standard errors are below a third of these bounds, so a correct sampler passes
for any seed and a wrong formula (median vs mean, sigma vs variance, no clipping) fails.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from pydantic import TypeAdapter

from servelab.profiles.schema import SecondsDist, TokenDist
from servelab.profiles.values_file import read_values_file

N = 10_000
Z = NormalDist()


def tokens(spec) -> np.ndarray:
    dist = TypeAdapter(TokenDist).validate_python(spec)
    return dist.sampler()(np.random.default_rng(12345), N)


def check(x: np.ndarray, mean: float, p50: float, p90: float, p99: float,
          mean_tol: float = 0.02) -> None:
    assert abs(x.mean() - mean) <= mean_tol * mean + 0.5, (x.mean(), mean)
    for p, want, tol in ((50, p50, 0.03), (90, p90, 0.03), (99, p99, 0.06)):
        got = np.percentile(x, p)
        assert abs(got - want) <= tol * want + 1, (p, got, want)


def test_fixed_and_shorthand():
    assert set(tokens({"kind": "fixed", "value": 128})) == {128}
    assert set(tokens(64)) == {64}


def test_uniform_integers_inclusive():
    x = tokens({"kind": "uniform", "min": 100, "max": 300})
    assert x.dtype == np.int64 and x.min() == 100 and x.max() == 300
    check(x, 200, 200, 280, 298)
    # Each of the 201 values appears: inclusive bounds, integer draws.
    assert len(np.unique(x)) == 201


def test_normal_unclipped():
    x = tokens({"kind": "normal", "mean": 500, "stdev": 100})
    check(x, 500, 500, 500 + 100 * Z.inv_cdf(0.9), 500 + 100 * Z.inv_cdf(0.99))
    assert abs(x.std() - 100) < 4


def test_normal_clipped_mean_matches_truncation_formula():
    mu, sd, a, b = 100.0, 50.0, 50, 200
    x = tokens({"kind": "normal", "mean": mu, "stdev": sd, "min": a, "max": b})
    al, be = (a - mu) / sd, (b - mu) / sd
    # E[clip(X, a, b)] for X ~ N(mu, sd^2)
    mean = (a * Z.cdf(al) + b * (1 - Z.cdf(be)) + mu * (Z.cdf(be) - Z.cdf(al))
            - sd * (Z.pdf(be) - Z.pdf(al)))
    def q(p):
        return min(max(mu + sd * Z.inv_cdf(p), a), b)
    check(x, mean, q(0.5), q(0.9), q(0.99))
    assert x.min() == a and x.max() == b
    # Clipping piles mass on the bound: P(X <= 50) = Phi(-1) = 0.1587.
    assert abs((x == a).mean() - Z.cdf(al)) < 0.015


def test_lognormal_median_form():
    med, sigma = 200.0, 0.6
    x = tokens({"kind": "lognormal", "median": med, "sigma": sigma})
    def q(p):
        return med * math.exp(sigma * Z.inv_cdf(p))
    check(x, med * math.exp(sigma ** 2 / 2), q(0.5), q(0.9), q(0.99), mean_tol=0.04)


def test_lognormal_mean_form():
    mean, sigma = 300.0, 0.5
    x = tokens({"kind": "lognormal", "mean": mean, "sigma": sigma})
    mu = math.log(mean) - sigma ** 2 / 2
    def q(p):
        return math.exp(mu + sigma * Z.inv_cdf(p))
    check(x, mean, q(0.5), q(0.9), q(0.99), mean_tol=0.04)


def test_lognormal_clipped():
    med, sigma, a, b = 100.0, 1.0, 20, 300
    x = tokens({"kind": "lognormal", "median": med, "sigma": sigma, "min": a, "max": b})
    mu = math.log(med)
    fa, fb = (math.log(a) - mu) / sigma, (math.log(b) - mu) / sigma
    inside = math.exp(mu + sigma ** 2 / 2) * (Z.cdf(fb - sigma) - Z.cdf(fa - sigma))
    mean = a * Z.cdf(fa) + b * (1 - Z.cdf(fb)) + inside
    def q(p):
        return min(max(med * math.exp(sigma * Z.inv_cdf(p)), a), b)
    check(x, mean, q(0.5), q(0.9), q(0.99))
    assert x.min() == a and x.max() == b


def test_empirical_samples_equally_likely():
    x = tokens({"kind": "empirical", "samples": [100, 200, 300, 1000]})
    assert set(np.unique(x)) == {100, 200, 300, 1000}
    assert abs(x.mean() - 400) <= 0.02 * 400
    for v in (100, 200, 300, 1000):
        assert abs((x == v).mean() - 0.25) < 0.02


def test_empirical_histogram():
    x = tokens({"kind": "empirical", "histogram": [{"min": 1, "max": 100, "weight": 1},
                                                   {"min": 101, "max": 200, "weight": 3}]})
    # Bin 1 holds 25% spread over 1..100, bin 2 75% over 101..200.
    mean = 0.25 * 50.5 + 0.75 * 150.5
    p50 = 101 + (0.5 - 0.25) / 0.75 * 100
    p90 = 101 + (0.9 - 0.25) / 0.75 * 100
    p99 = 101 + (0.99 - 0.25) / 0.75 * 100
    check(x, mean, p50, p90, p99)
    assert abs((x <= 100).mean() - 0.25) < 0.02


def test_empirical_from_csv_and_jsonl_files(tmp_path):
    csv_path = tmp_path / "lengths.csv"
    csv_path.write_text("# prompt lengths\nrequest,prompt\na,100\nb,300\nc,500\n")
    jsonl_path = tmp_path / "lengths.jsonl"
    jsonl_path.write_text('{"n": 10}\n{"n": 30}\n\n{"n": 50}\n')
    assert read_values_file(csv_path, "prompt") == [100, 300, 500]
    assert read_values_file(jsonl_path, "n") == [10, 30, 50]
    x = tokens_from_file(tmp_path, "lengths.csv", "prompt")
    assert set(np.unique(x)) == {100, 300, 500}
    assert abs(x.mean() - 300) <= 0.02 * 300


def tokens_from_file(base, name, column):
    dist = TypeAdapter(TokenDist).validate_python(
        {"kind": "empirical", "file": name, "column": column}, context={"base_dir": base})
    return dist.sampler()(np.random.default_rng(3), N)


def test_values_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("n\n10\nten\n")
    with pytest.raises(ValueError, match="line 3: 'ten' is not a number"):
        read_values_file(bad)
    wide = tmp_path / "wide.csv"
    wide.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="name one with 'column'"):
        read_values_file(wide)


def test_seconds_distribution_is_real_valued():
    dist = TypeAdapter(SecondsDist).validate_python({"kind": "uniform", "min": "1s", "max": 3})
    x = dist.sampler()(np.random.default_rng(5), N)
    assert x.dtype == float and 1 <= x.min() and x.max() < 3
    assert abs(x.mean() - 2.0) < 0.02 and len(np.unique(x)) > N - 10
    fixed = TypeAdapter(SecondsDist).validate_python("1m30s")
    assert set(fixed.sampler()(np.random.default_rng(5), 10)) == {90.0}
