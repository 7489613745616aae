"""Length, turn-count and time distributions of the profile language, and the model helpers the
schema shares: ``problem`` (a located error), ``Strict`` (unknown keys and non-finite numbers are
errors) and durations. Every number is bounded (``limits``) so that sampling cannot overflow.
"""
# No `from __future__ import annotations`: the distribution models are built inside a function
# and pydantic must see their annotations as objects, not strings.
import math
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationInfo
from pydantic import model_validator
from pydantic_core import PydanticCustomError

from servelab.profiles.durations import ALLOWED as DURATION_ALLOWED
from servelab.profiles.durations import parse_duration
from servelab.profiles.limits import MAX_DURATION_S, MAX_SIGMA, MAX_TOKENS, MAX_WEIGHT

MAX_TURNS = 100


def problem(field: str | None, found, allowed: str) -> PydanticCustomError:
    """An error the loader prints as `path.field: found X; allowed Y` at the field's line."""
    if isinstance(found, float):
        found = f"{found:g}"
    return PydanticCustomError(
        "servelab", "found {found}; allowed {allowed}",
        {"field": field or "", "found": str(found), "allowed": allowed},
    )


def _duration(value):
    try:
        return parse_duration(value)
    except ValueError:
        raise problem(None, repr(value), DURATION_ALLOWED) from None


Duration = Annotated[float, BeforeValidator(_duration)]
PositiveDuration = Annotated[float, BeforeValidator(_duration), Field(gt=0)]


class Strict(BaseModel):
    # No infinities or NaN anywhere: the planner and the summary do arithmetic on every number.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Weight = Annotated[float, Field(ge=0, le=MAX_WEIGHT)]


def _base_dir(info: ValidationInfo) -> Path:
    ctx = info.context or {}
    return Path(ctx.get("base_dir") or ".")


def _dist_union(number, low: float, high: float, unit: str, shorthand_types: tuple):
    """Build the tagged union of length/count/time distributions for one unit."""

    class Fixed(Strict):
        kind: Literal["fixed"]
        value: number

    class Uniform(Strict):
        kind: Literal["uniform"]
        min: number
        max: number

        @model_validator(mode="after")
        def _order(self):
            if self.max < self.min:
                raise problem("max", f"{self.max:g} < min {self.min:g}", "max >= min")
            return self

    real = number if unit == "seconds" else Annotated[float, Field(ge=0, le=high)]
    centre = Optional[Annotated[float, Field(gt=0, le=high)]]

    class Normal(Strict):
        kind: Literal["normal"]
        mean: real
        stdev: real
        min: Optional[number] = None
        max: Optional[number] = None

        @model_validator(mode="after")
        def _order(self):
            lo = low if self.min is None else self.min
            if self.max is not None and self.max < lo:
                raise problem("max", f"{self.max:g} < min {lo:g}", "max >= min")
            return self

    class LogNormal(Strict):
        kind: Literal["lognormal"]
        median: centre = None
        mean: centre = None
        sigma: Annotated[float, Field(ge=0, le=MAX_SIGMA)]
        min: Optional[number] = None
        max: Optional[number] = None

        @model_validator(mode="after")
        def _shape(self):
            if (self.median is None) == (self.mean is None):
                found = "both median and mean" if self.median is not None else "neither"
                raise problem("median", found, "exactly one of median or mean (with sigma)")
            lo = low if self.min is None else self.min
            if self.max is not None and self.max < lo:
                raise problem("max", f"{self.max:g} < min {lo:g}", "max >= min")
            return self

    class Bin(Strict):
        min: number
        max: number
        weight: Weight

        @model_validator(mode="after")
        def _order(self):
            if self.max < self.min:
                raise problem("max", f"{self.max:g} < min {self.min:g}", "max >= min")
            return self

    class Empirical(Strict):
        kind: Literal["empirical"]
        samples: Optional[Annotated[list[number], Field(min_length=1)]] = None
        histogram: Optional[Annotated[list[Bin], Field(min_length=1)]] = None
        file: Optional[str] = None
        column: Optional[str] = None
        _values: Optional[list] = PrivateAttr(default=None)

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
                from servelab.profiles.distributions import read_values_file

                path = _base_dir(info) / self.file
                try:
                    values = read_values_file(path, self.column)
                except (OSError, ValueError) as exc:
                    raise problem("file", f"{self.file!r} ({exc})",
                                  f"a CSV or JSONL file of {unit} >= {low:g}, relative to the "
                                  "profile's folder") from None
                bad = [v for v in values if not low <= v <= high]
                if bad:
                    raise problem("file", f"{self.file!r} with value {bad[0]:g}",
                                  f"{unit} from {low:g} to {int(high):,}")
                self._values = values
            return self

    def shorthand(value):
        # `output_tokens: 128` (or `think_time: 5s`) means a fixed value.
        if isinstance(value, shorthand_types) and not isinstance(value, bool):
            return {"kind": "fixed", "value": value}
        return value

    union = Union[Fixed, Uniform, Normal, LogNormal, Empirical]
    return Annotated[union, Field(discriminator="kind"), BeforeValidator(shorthand)]


Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
TokenDist = _dist_union(Tokens, 1, MAX_TOKENS, "token counts", (int, float, str))
TurnDist = _dist_union(Annotated[int, Field(ge=1, le=MAX_TURNS)], 1, MAX_TURNS, "turn counts",
                       (int, float, str))
SecondsDist = _dist_union(Duration, 0, MAX_DURATION_S, "seconds", (int, float, str))


def upper_bound(dist) -> float:
    """The largest value a distribution can produce (inf when unbounded)."""
    if dist.kind == "fixed":
        return dist.value
    if dist.kind in ("uniform",):
        return dist.max
    if dist.kind in ("normal", "lognormal"):
        return math.inf if dist.max is None else dist.max
    if dist.samples is not None:
        return max(dist.samples)
    if dist.histogram is not None:
        return max(b.max for b in dist.histogram if b.weight > 0)
    return max(dist._values)


