"""The empirical kind: measured lengths given as samples, a histogram, or a file of numbers.

A sample is one of the values with equal probability; from a histogram, a bin is chosen with
probability weight / sum(weights) and a uniform value drawn inside it.
"""
# No `from __future__ import annotations`: pydantic must see the annotations as objects.
from typing import Annotated, Generic, Literal, Optional

import numpy as np
from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from servelab.profiles.dists.base import Distribution, Ordered
from servelab.profiles.dists.unit import Number, Sampler
from servelab.profiles.fields import Weight, problem, profile_folder
from servelab.profiles.values_file import read_values_file


class Bin(Ordered, Generic[Number]):
    min: Number
    max: Number
    weight: Weight


class Empirical(Distribution, Generic[Number]):
    kind: Literal["empirical"]
    samples: Optional[Annotated[list[Number], Field(min_length=1)]] = None
    histogram: Optional[Annotated[list[Bin[Number]], Field(min_length=1)]] = None
    file: Optional[str] = None
    column: Optional[str] = None
    _values: Optional[list] = PrivateAttr(default=None)   # the file's numbers

    @model_validator(mode="after")
    def _source(self, info: ValidationInfo):
        given = [k for k in ("samples", "histogram", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise problem("samples", "both " + " and ".join(given) if given else "none of them",
                          "exactly one of samples, histogram or file")
        if self.column is not None and self.file is None:
            raise problem("column", repr(self.column), "column only together with file")
        if self.histogram is not None and sum(b.weight for b in self.histogram) <= 0:
            raise problem("histogram", "weights summing to 0", "weights with a positive sum")
        if self.file is not None:
            self._values = self._read(info)
        return self

    def _read(self, info: ValidationInfo) -> list[float]:
        unit = self.unit
        try:
            values = read_values_file(profile_folder(info) / self.file, self.column)
        except (OSError, ValueError) as exc:
            raise problem("file", f"{self.file!r} ({exc})",
                          f"a CSV or JSONL file of {unit.name} >= {unit.low:g}, relative to the "
                          "profile's folder") from None
        bad = [v for v in values if not unit.low <= v <= unit.high]
        if bad:
            raise problem("file", f"{self.file!r} with value {bad[0]:g}",
                          f"{unit.name} from {unit.low:g} to {int(unit.high):,}")
        return values

    def sampler(self) -> Sampler:
        if self.histogram is not None:
            return self._histogram_sampler()
        values = np.asarray(self.samples if self.samples is not None else self._values, float)
        return lambda rng, size: self.unit.cast(values[rng.integers(0, len(values), size=size)])

    def _histogram_sampler(self) -> Sampler:
        bins = self.histogram
        weights = np.abs(np.array([b.weight for b in bins], float))
        p = weights / weights.sum()
        lo = np.array([b.min for b in bins], float)
        hi = np.array([b.max for b in bins], float)
        integer = self.unit.integer

        def sample(rng, size):
            which = rng.choice(len(bins), size=size, p=p)
            if integer:
                return rng.integers(lo[which].astype(np.int64), hi[which].astype(np.int64) + 1)
            return rng.uniform(lo[which], hi[which])
        return sample

    def describe(self, label: str = "") -> str:
        if self.samples is not None:
            return f"empirical, {len(self.samples)} samples"
        if self.histogram is not None:
            return f"empirical histogram, {len(self.histogram)} bins"
        return f"empirical from {self.file} ({len(self._values)} values)"

    def upper_bound(self) -> float:
        if self.samples is not None:
            return max(self.samples)
        if self.histogram is not None:
            return max(b.max for b in self.histogram if b.weight > 0)
        return max(self._values)
