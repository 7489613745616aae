"""What a distribution counts: token counts, turn counts or seconds.

A unit gives the kinds their number types (so `Fixed` of tokens takes whole numbers from 1 and
`Fixed` of seconds takes "5s"), the floor and ceiling that unbounded draws are clipped to, and
whether draws are rounded to integers.
"""
# No `from __future__ import annotations`: pydantic must see the annotations as objects.
import math
from dataclasses import dataclass
from typing import Annotated, Callable, Optional, TypeVar

import numpy as np
from pydantic import Field

from servelab.profiles.fields import Duration
from servelab.profiles.limits import MAX_DURATION_S, MAX_TOKENS

MAX_TURNS = 100

# The type parameters of the kind models, replaced by a unit's types (`Unit.types`).
Number = TypeVar("Number")    # a value, a bound: min, max, samples, bins
Real = TypeVar("Real")        # a normal's mean and stdev
Centre = TypeVar("Centre")    # a lognormal's median or mean

Sampler = Callable[[np.random.Generator, "int | tuple[int, ...]"], np.ndarray]


@dataclass(frozen=True, eq=False)
class Unit:
    name: str          # as messages say it: "token counts"
    number: object     # the annotation of one value
    low: float         # the floor when a distribution names no min
    high: float        # the ceiling when it names no max: a lognormal tail may not overflow
    integer: bool

    @property
    def types(self) -> dict:
        # Seconds keep their duration syntax ("500ms") for mean and stdev; counts take any real.
        real = self.number if not self.integer else Annotated[float, Field(ge=0, le=self.high)]
        centre = Optional[Annotated[float, Field(gt=0, le=self.high)]]
        return {Number: self.number, Real: real, Centre: centre}

    def cast(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.int64) if self.integer else x.astype(float)

    def clipped(self, draw: Sampler, lo: float, hi: float) -> Sampler:
        """Values outside [lo, hi] set to the bound; integers rounded, then clipped again so
        the bounds hold exactly."""
        def sample(rng, size):
            x = np.clip(draw(rng, size), lo, hi)
            return self.cast(np.clip(np.rint(x), math.ceil(lo), hi)) if self.integer else x
        return sample


TOKENS = Unit("token counts", Annotated[int, Field(ge=1, le=MAX_TOKENS)], 1, MAX_TOKENS, True)
TURNS = Unit("turn counts", Annotated[int, Field(ge=1, le=MAX_TURNS)], 1, MAX_TURNS, True)
SECONDS = Unit("seconds", Duration, 0, MAX_DURATION_S, False)
