"""The percentile every Python-side figure uses: DuckDB's ``quantile_cont`` (linear interpolation
between the order statistics at floor(h) and floor(h)+1, h = (n-1)q; numpy's default), so a number
computed in Python equals the one the SQL views give for the same samples."""
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
