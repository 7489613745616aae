"""How a search finds the highest load that meets an SLO attainment target: one definition for
the Locust master that runs the probes (``loadgen.search_shape``), predict's virtual-time search
that seeds it (``orchestration.search_virtual``) and every reader of a stored search
(``servelab search``, the report), so that all of them tell the same story.

- Levels: the plan's own levels (users, or requests/s), ascending. ``servelab search`` writes
  them as a geometric grid (``level_grid``): neighbours are one resolution step apart.
- A probe is one stage at one level (warm-up, then hold). Its attainment is stage_summary's
  ``slo_attainment`` of class '(all)': requests meeting every SLO of their class over all its
  measured requests, failures included. Its interval is the Wilson score interval at 95% over
  the same requests.
- Verdict: met when the attainment is at or above the target, missed below. A probe at which the
  generator saturated, the host was busy, the server stopped answering, or failed (or dropped)
  requests passed the error limit is missed *because of* that, and never read as a measurement of
  the server. A verdict is *decided* when the interval lies on one side of the target.
- Order: bisection over the positions (the middle first); or, given a start (a prediction),
  that level first, then 1, 2, 4, ... positions away from it until the limit is bracketed, then
  bisection.
- Stop: the highest met and the lowest missed level are neighbours (the resolution); the lowest
  level missed or the highest met; the server stopped answering; or the last two probes, inside
  a closed bracket, both could not decide: the attainment is within its noise of the target
  there, and bisecting further would follow noise.
- Answer: the highest met level below the lowest missed one; its interval [low, high]: low the
  highest level *decided* met, high the lowest *decided* missed (None: none found in the range).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

Z95 = 1.959964   # the normal quantile of a two-sided 95% interval
DEFAULT_TARGET = 0.95
DEFAULT_RESOLUTION = 0.10
DEFAULT_MAX_ERROR_RATE = 0.5
KIND = "search"  # the stages table's kind of a probe

STOPS = {
    "resolution": "the highest level met and the lowest missed are neighbours (one resolution "
                  "step apart)",
    "undecided": "the last two probes inside the bracket could not decide (their intervals hold "
                 "the target): the attainment is within its noise of the target there",
    "none_meets": "no level meets the target: even the lowest misses",
    "all_meet": "every level up to the highest meets the target: the limit is above the range "
                "(raise --max)",
    "server_down": "the server stopped answering: the search stopped, what was measured is kept",
}


def wilson(met: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a share met/n (None without requests). Unlike the normal
    approximation it stays inside [0, 1] and is honest at 100%, where most passing probes sit."""
    if n <= 0:
        return None
    p = met / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def level_grid(low: float, high: float, resolution: float, integer: bool) -> list[float]:
    """Levels from low to high (both included), each at most ``1 + resolution`` times the last:
    rounded down (users to whole numbers, rates to 3 significant digits) so no step is wider;
    below 1/resolution users every whole number is a level."""
    if not 0 < low <= high:
        raise ValueError(f"levels from {low:g} to {high:g}: need 0 < low <= high")
    out = [float(math.floor(low)) if integer else float(low)]
    while out[-1] < high:
        v = out[-1] * (1.0 + resolution)
        v = max(out[-1] + 1.0, math.floor(v + 1e-9)) if integer else _down3(v)
        out.append(min(float(v), float(high)))
    return out


def _down3(v: float) -> float:
    scale = 10.0 ** (2 - math.floor(math.log10(v)))
    return math.floor(v * scale + 1e-9) / scale


def stage_index(last: int | None, plan_index: int, plan_size: int, cyclic: bool) -> int:
    """The next probe's stage index. Closed loop: the next number. Open loop (``cyclic``): the
    smallest index above the last one that names the plan's rate, i % plan_size == plan_index
    (planner.arrival_times repeats the rates past the plan's end)."""
    nxt = 0 if last is None else last + 1
    if not cyclic:
        return nxt
    return nxt + (plan_index - nxt) % plan_size


@dataclass
class Probe:
    position: int                 # index into the ascending levels
    level: float
    requests: int                 # measured requests (stage_summary '(all)')
    met: int                      # of them, meeting every SLO of their class
    stage: int | None = None
    errors: int = 0
    cause: str | None = None      # why it missed whatever its attainment
    down: bool = False            # the server stopped answering
    target: float = DEFAULT_TARGET

    @property
    def attainment(self) -> float | None:
        return self.met / self.requests if self.requests else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson(self.met, self.requests)

    @property
    def verdict(self) -> str:
        a = self.attainment
        return "missed" if self.cause or a is None or a < self.target else "met"

    @property
    def decided(self) -> bool:
        iv = self.interval
        if self.cause or iv is None:
            return True
        return iv[0] >= self.target if self.verdict == "met" else iv[1] < self.target

    def label(self) -> str:
        """The verdict as a reader wants it: met / missed, how sure, and why."""
        if self.cause:
            return f"missed, because {self.cause}"
        if self.decided:
            return self.verdict
        return f"{self.verdict} (undecided: the interval holds the target)"

    def as_json(self) -> dict:
        iv = self.interval
        return {"stage": self.stage, "level": self.level, "requests": self.requests,
                "met": self.met, "errors": self.errors, "attainment": self.attainment,
                "interval": [round(v, 6) for v in iv] if iv else None, "verdict": self.verdict,
                "decided": self.decided, "cause": self.cause}


@dataclass
class Answer:
    limit: float | None           # highest level met below the lowest missed
    low: float | None             # highest level decided met
    high: float | None            # lowest level decided missed
    stop: str | None              # a STOPS key; None: the search had not finished
    best: Probe | None = None     # the highest attainment measured (for "no level meets")
    high_cause: str | None = None  # the high end is a "missed because", not the server's

    def as_json(self) -> dict:
        return {"limit": self.limit, "limit_interval": [self.low, self.high],
                "stop": self.stop, "stop_reason": STOPS.get(self.stop, "the run ended before "
                                                            "the search did"),
                "best_level": self.best.level if self.best else None,
                "best_attainment": self.best.attainment if self.best else None}


@dataclass
class Bisection:
    """The search's state: ``next_position`` (None: stopped, ``stop`` says why), ``record``."""
    levels: list[float]
    start: int | None = None      # seeded: probe this position first, then gallop from it
    probes: list[Probe] = field(default_factory=list)
    stop: str | None = None

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)

    def bracket(self) -> tuple[int, int]:
        """(lo, hi): the highest met position below the lowest missed one, and that one; -1
        and len(levels) stand for "below the range" and "above it"."""
        n = len(self.levels)
        hi = min((p.position for p in self.probes if p.verdict == "missed"), default=n)
        lo = max((p.position for p in self.probes if p.verdict == "met" and p.position < hi),
                 default=-1)
        return lo, hi

    def next_position(self) -> int | None:
        if self.stop is None:
            self.stop = self._stop_reason()
        if self.stop is not None:
            return None
        if not self.probes:
            return self.start if self.start is not None else (len(self.levels) - 1) // 2
        lo, hi = self.bracket()
        n = len(self.levels)
        if self.start is None or (lo >= 0 and hi < n):
            return (lo + hi) // 2
        # Seeded, one side still open: every probe so far agrees; double the step each time.
        step = 2 ** (len(self.probes) - 1)
        return min(n - 1, lo + step) if hi == n else max(0, hi - step)

    def _stop_reason(self) -> str | None:
        if not self.probes:
            return None
        if self.probes[-1].down:
            return "server_down"
        lo, hi = self.bracket()
        n = len(self.levels)
        if hi - lo <= 1:
            return "none_meets" if lo < 0 else "all_meet" if hi >= n else "resolution"
        last_two = self.probes[-2:]
        if lo >= 0 and hi < n and len(last_two) == 2 and not any(p.decided for p in last_two):
            return "undecided"
        return None

    def answer(self) -> Answer:
        lo, hi = self.bracket()
        limit = self.levels[lo] if lo >= 0 else None
        sure_met = [p for p in self.probes if p.verdict == "met" and p.decided and
                    p.position < hi]
        sure_missed = [p for p in self.probes if p.verdict == "missed" and p.decided]
        low = max(sure_met, key=lambda p: p.position, default=None)
        high = min(sure_missed, key=lambda p: p.position, default=None)
        measured = [p for p in self.probes if p.attainment is not None and not p.cause]
        best = max(measured, key=lambda p: (p.attainment, p.level), default=None)
        return Answer(limit, low.level if low else None, high.level if high else None,
                      self.stop, best, high.cause if high else None)


def start_position(levels: list[float], start: float | None) -> int | None:
    """The position of the level to probe first: the one nearest ``start`` (None or 0: none, a
    plain bisection from the middle)."""
    if not start or not levels:
        return None
    return min(range(len(levels)), key=lambda i: (abs(math.log(levels[i] / start)), i))


def plain_bisection_probes(size: int) -> int:
    """The probes a bisection of ``size`` levels takes at most (a stop on two undecided probes
    in a row can make it fewer)."""
    return max(1, math.ceil(math.log2(size + 1)))
