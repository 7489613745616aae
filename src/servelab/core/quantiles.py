"""The percentile every Python-side figure uses: DuckDB's ``quantile_cont`` (linear interpolation
between the order statistics at floor(h) and floor(h)+1, h = (n-1)q; numpy's default), so a number
computed in Python equals the one the SQL views give for the same samples. ``weighted_quantiles``
is the same definition over a multiset given as sorted values with integer multiplicities (a
bootstrap resample: each request counted as often as it was drawn), vectorised over resamples;
``order_statistics`` the bounds a percentile interval takes without interpolating. numpy is
imported only by those two (a worker or the simulator need not load it for a median)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def quantiles_cont(values: Iterable[float | None], qs: Sequence[float]) -> list[float]:
    """``quantile_cont`` at each q of ``qs``, sorting once (the live window asks for p50 and p99
    of the same samples every second)."""
    s = sorted(v for v in values if v is not None and v == v)
    return [_at(s, q) for q in qs]


def quantile_cont(values: Iterable[float | None], q: float) -> float:
    """q in 0..1; None and NaN are skipped, +inf allowed; NaN when nothing is left."""
    return quantiles_cont(values, (q,))[0]


def _at(s: list[float], q: float) -> float:
    if not s:
        return math.nan
    h = (len(s) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    a, b = s[lo], s[hi]
    frac = h - lo
    # inf - inf is nan: at an exact rank, or between two equal bounds, the answer is the bound.
    return a if frac == 0 or a == b else a + (b - a) * frac


def _interpolate(lo, hi, frac):
    import numpy as np

    with np.errstate(invalid="ignore"):
        out = lo + (hi - lo) * frac
    # inf - inf is nan: between two infinities (or at an exact rank) the answer is the bound itself.
    same = (lo == hi) | (frac == 0)
    return np.where(same, lo, out)


def weighted_quantiles(sorted_values, weights, qs):
    """``quantile_cont`` of the multiset where sorted_values[i] occurs weights[..., i] times.

    ``weights`` may be 2-D (one resample per row); the result then has one row per resample and
    one column per q. Rows whose weights sum to zero give NaN.
    """
    import numpy as np

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


def order_statistics(values, q_lo: float, q_hi: float) -> tuple[float, float]:
    """The order statistics at floor((n-1) q_lo) and ceil((n-1) q_hi) of the non-empty
    ``values`` (numpy's "lower" and "higher" methods): outer bounds, no interpolation, so
    infinite values stay exact."""
    import numpy as np

    s = np.sort(np.asarray(values, dtype=float))
    n = s.size
    return float(s[math.floor((n - 1) * q_lo)]), float(s[math.ceil((n - 1) * q_hi)])
