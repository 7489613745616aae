"""A closed-loop user's back-off from a server that fails at once.

Without it a user whose requests keep failing fast (connection refused or reset, HTTP 5xx) hits
the server as fast as it answers: 260 requests/s for one user against a server failing every
request. From the second such failure in a row the user waits ``BACKOFF_BASE_S``, doubling each
time up to ``BACKOFF_MAX_S``; any other outcome (a success, a timeout, a 4xx) resets it, so a
run against a healthy server never waits. Open-loop arrivals keep their schedule: their rate is
the experiment.
"""
from __future__ import annotations

BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 2.0


def backs_off(error_kind: str | None) -> bool:
    return error_kind is not None and (error_kind.startswith("connect_")
                                       or error_kind.startswith("http_5"))


def backoff_s(failures: int) -> float:
    """The wait after ``failures`` fast failures in a row (0 for the first)."""
    if failures < 2:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (failures - 2))
