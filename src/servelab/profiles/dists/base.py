"""What every distribution kind answers: its sampler, its description, its largest value."""
import math
from typing import ClassVar

from pydantic import model_validator

from servelab.profiles.dists.unit import Sampler, Unit
from servelab.profiles.fields import Strict, problem


class Distribution(Strict):
    unit: ClassVar[Unit]   # set on each kind's model for one unit (`dists.distribution`)

    def sampler(self) -> Sampler:
        """A function (rng, size) -> array; the planner draws a whole block at once."""
        raise NotImplementedError

    def describe(self, label: str = "") -> str:
        """One line for `profiles show`; ``label`` names the unit ("tokens")."""
        raise NotImplementedError

    def upper_bound(self) -> float:
        """The largest value it can produce (inf when unbounded)."""
        raise NotImplementedError


def check_order(lo, hi) -> None:
    if hi is not None and hi < lo:
        raise problem("max", f"{hi:g} < min {lo:g}", "max >= min")


class Ordered(Strict):
    """A model with both ``min`` and ``max`` given (a uniform range, a histogram bin)."""

    @model_validator(mode="after")
    def _order(self):
        check_order(self.min, self.max)
        return self


class Clipped(Distribution):
    """Normal and lognormal: an unbounded draw clipped to [min, max] (the unit's when unset)."""

    def _bounds(self) -> tuple[float, float]:
        lo = self.unit.low if self.min is None else float(self.min)
        hi = self.unit.high if self.max is None else float(self.max)
        return lo, hi

    def _clip_text(self) -> str:
        if self.min is None and self.max is None:
            return ""
        lo = "" if self.min is None else f"{self.min:g}"
        hi = "" if self.max is None else f"{self.max:g}"
        return f", clipped to [{lo}, {hi}]"

    def upper_bound(self) -> float:
        return math.inf if self.max is None else self.max
