"""The kinds given by parameters: fixed, uniform, normal, lognormal.

Formulas (x is the drawn value before clipping):
- fixed:     x = value
- uniform:   integers min..max inclusive (tokens, turns), or a real in [min, max) (seconds)
- normal:    x ~ Normal(mean, stdev)
- lognormal: ln x ~ Normal(mu, sigma), mu = ln(median), or mu = ln(mean) - sigma^2 / 2
"""
# No `from __future__ import annotations`: pydantic must see the annotations as objects.
import math
from typing import Annotated, Generic, Literal, Optional

import numpy as np
from pydantic import Field, model_validator

from servelab.profiles.dists.base import Clipped, Distribution, Ordered, check_order
from servelab.profiles.dists.unit import Centre, Number, Real, Sampler
from servelab.profiles.fields import problem
from servelab.profiles.limits import MAX_SIGMA


class Fixed(Distribution, Generic[Number]):
    kind: Literal["fixed"]
    value: Number

    def sampler(self) -> Sampler:
        value = float(self.value)
        return self.unit.clipped(lambda rng, size: np.full(size, value),
                                 self.unit.low, self.unit.high)

    def describe(self, label: str = "") -> str:
        return f"fixed {self.value:g}{_suffix(label)}"

    def upper_bound(self) -> float:
        return self.value


class Uniform(Distribution, Ordered, Generic[Number]):
    kind: Literal["uniform"]
    min: Number
    max: Number

    def sampler(self) -> Sampler:
        lo, hi = float(self.min), float(self.max)
        if self.unit.integer:
            return lambda rng, size: rng.integers(int(lo), int(hi) + 1, size=size)
        return lambda rng, size: rng.uniform(lo, hi, size=size)

    def describe(self, label: str = "") -> str:
        return f"uniform {self.min:g}..{self.max:g}{_suffix(label)}"

    def upper_bound(self) -> float:
        return self.max


class Normal(Clipped, Generic[Number, Real]):
    kind: Literal["normal"]
    mean: Real
    stdev: Real
    min: Optional[Number] = None
    max: Optional[Number] = None

    @model_validator(mode="after")
    def _order(self):
        check_order(self.unit.low if self.min is None else self.min, self.max)
        return self

    def sampler(self) -> Sampler:
        # abs(): numpy refuses a stdev or sigma of -0.0, which the schema's ">= 0" lets through.
        mean, stdev = float(self.mean), abs(float(self.stdev))
        return self.unit.clipped(lambda rng, size: rng.normal(mean, stdev, size=size),
                                 *self._bounds())

    def describe(self, label: str = "") -> str:
        return f"normal mean {self.mean:g} stdev {self.stdev:g}{self._clip_text()}"


class LogNormal(Clipped, Generic[Number, Centre]):
    kind: Literal["lognormal"]
    median: Centre = None
    mean: Centre = None
    sigma: Annotated[float, Field(ge=0, le=MAX_SIGMA)]
    min: Optional[Number] = None
    max: Optional[Number] = None

    @model_validator(mode="after")
    def _shape(self):
        if (self.median is None) == (self.mean is None):
            found = "both median and mean" if self.median is not None else "neither"
            raise problem("median", found, "exactly one of median or mean (with sigma)")
        check_order(self.unit.low if self.min is None else self.min, self.max)
        return self

    @property
    def mu(self) -> float:
        if self.median is not None:
            return math.log(self.median)
        return math.log(self.mean) - self.sigma ** 2 / 2

    def sampler(self) -> Sampler:
        mu, sigma = self.mu, abs(float(self.sigma))
        return self.unit.clipped(lambda rng, size: rng.lognormal(mu, sigma, size=size),
                                 *self._bounds())

    def describe(self, label: str = "") -> str:
        centre = f"median {self.median:g}" if self.median is not None else f"mean {self.mean:g}"
        return f"lognormal {centre} sigma {self.sigma:g}{self._clip_text()}"


def _suffix(label: str) -> str:
    return f" {label}" if label else ""
