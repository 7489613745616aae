"""Percentiles that match DuckDB's ``quantile_cont`` and bootstrap resampling over raw rows.

``quantile_cont`` interpolates linearly between the order statistics at floor(h) and
floor(h)+1, h = (n-1)q (numpy's default "linear" method). ``weighted_quantiles`` gives the same
answer for a multiset given as sorted values with integer multiplicities, which is what the
token view of ITL (a chunk gap counted once per token) and a bootstrap resample (each request
counted as often as it was drawn) both are, without materialising the repeats.
"""
from __future__ import annotations

import numpy as np

from servelab.core.quantiles import quantile_cont  # noqa: F401  (re-exported: one definition)


def _interpolate(lo: np.ndarray, hi: np.ndarray, frac: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        out = lo + (hi - lo) * frac
    # inf - inf is nan: between two infinities (or at an exact rank) the answer is the bound itself.
    same = (lo == hi) | (frac == 0)
    return np.where(same, lo, out)


def weighted_quantiles(sorted_values: np.ndarray, weights: np.ndarray, qs) -> np.ndarray:
    """Quantiles of the multiset where sorted_values[i] occurs weights[..., i] times.

    ``weights`` may be 2-D (one resample per row); the result then has one row per resample and
    one column per q. Rows whose weights sum to zero give NaN.
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.int64))
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1] if cum.shape[1] else np.zeros(w.shape[0], dtype=np.int64)
    out = np.full((w.shape[0], len(qs)), np.nan)
    if sorted_values.size == 0:
        return out if np.ndim(weights) > 1 else out[0]
    ok = total > 0
    for j, q in enumerate(qs):
        h = (total - 1) * q
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, total - 1)
        # The element at 0-based position p is the first index whose cumulative count exceeds p.
        i_lo = np.array([np.searchsorted(c, p, side="right") for c, p in zip(cum, lo)])
        i_hi = np.array([np.searchsorted(c, p, side="right") for c, p in zip(cum, hi)])
        i_lo = np.minimum(i_lo, sorted_values.size - 1)
        i_hi = np.minimum(i_hi, sorted_values.size - 1)
        val = _interpolate(sorted_values[i_lo], sorted_values[i_hi], h - lo)
        out[:, j] = np.where(ok, val, np.nan)
    return out if np.ndim(weights) > 1 else out[0]


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the finite-or-infinite, non-NaN replicates."""
    r = np.asarray(replicates, dtype=float)
    r = r[~np.isnan(r)]
    if r.size < 20:
        return None
    alpha = (1 - level) / 2
    # Order statistics rather than interpolation: replicates may be infinite (error-adjusted
    # percentiles), and the outer order statistics keep the interval conservative.
    lo = np.quantile(r, alpha, method="lower")
    hi = np.quantile(r, 1 - alpha, method="higher")
    return float(lo), float(hi)


def ratio(a, b):
    """a / b elementwise; equal values (both infinite included) give exactly 1, a zero
    denominator under a non-zero numerator gives NaN (no meaningful ratio), like the SQL view."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = a / b
    return np.where(a == b, 1.0, np.where(b == 0, np.nan, r))
