"""The live figures of the last ten seconds (TTFT and ITL percentiles, errors) for the status
file and the progress line; the stored rows, not these, are the run's result."""
from __future__ import annotations

import time
from collections import deque

from servelab.core.quantiles import quantile_cont

LIVE_WINDOW_S = 10.0


class LiveWindow:
    def __init__(self, window_s: float = LIVE_WINDOW_S):
        self.window_s = window_s
        self.errors = 0     # over the whole run
        self._samples: deque = deque()

    def add(self, samples) -> None:
        """(ttft_ms, mean itl_ms, ok) of each request a worker shipped in one batch."""
        now = time.monotonic()
        for ttft, itl, ok in samples:
            self._samples.append((now, ttft, itl, ok))
            if not ok:
                self.errors += 1

    def figures(self) -> dict:
        now = time.monotonic()
        live = self._samples
        while live and now - live[0][0] > self.window_s:
            live.popleft()
        ttft = [x[1] for x in live if x[3] and x[1] is not None]
        itl = [x[2] for x in live if x[3] and x[2] is not None]
        return {"ttft_p50_ms": _q(ttft, 0.5), "ttft_p99_ms": _q(ttft, 0.99),
                "itl_p50_ms": _q(itl, 0.5), "itl_p99_ms": _q(itl, 0.99)}


def _q(values: list, q: float) -> float | None:
    return quantile_cont(values, q) if values else None   # None, not NaN: the file is JSON
