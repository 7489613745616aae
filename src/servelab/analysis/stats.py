"""The bootstrap's interval and ratio arithmetic. Its percentiles are ``core.quantiles``' (one
definition: ``quantile_cont``, ``weighted_quantiles`` for a resample given as multiplicities,
``order_statistics`` for an interval's bounds), re-exported here for the analysis layer."""
from __future__ import annotations

import numpy as np

from servelab.core.quantiles import order_statistics, quantile_cont, weighted_quantiles  # noqa: F401


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the finite-or-infinite, non-NaN replicates."""
    r = np.asarray(replicates, dtype=float)
    r = r[~np.isnan(r)]
    if r.size < 20:
        return None
    alpha = (1 - level) / 2
    # Order statistics rather than interpolation: replicates may be infinite (error-adjusted
    # percentiles), and the outer order statistics keep the interval conservative.
    return order_statistics(r, alpha, 1 - alpha)


def ratio(a, b):
    """a / b elementwise; equal values (both infinite included) give exactly 1, a zero
    denominator under a non-zero numerator gives NaN (no meaningful ratio), like the SQL view."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = a / b
    return np.where(a == b, 1.0, np.where(b == 0, np.nan, r))
