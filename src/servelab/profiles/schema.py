"""The traffic-profile language as pydantic models: unknown keys are errors, unions are tagged.

Cross-field rules that concern one mapping (min <= max, exactly one of median/mean) live in that
model's validator and raise ``problem(field, found, allowed)`` so the loader can point at the
field. Rules that span the whole profile (weights, class names, trace vs lengths) are checked by
the loader on the raw YAML, so they are reported even when other parts fail to validate.
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

MAX_TURNS = 100
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
TEXT_SOURCES = ("modern", "kjv", "code")


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
    model_config = ConfigDict(extra="forbid")


def _base_dir(info: ValidationInfo) -> Path:
    ctx = info.context or {}
    return Path(ctx.get("base_dir") or ".")


def _dist_union(number, low: float, unit: str, shorthand_types: tuple):
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

    real = number if unit == "seconds" else Annotated[float, Field(ge=0)]

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
        median: Optional[Annotated[float, Field(gt=0)]] = None
        mean: Optional[Annotated[float, Field(gt=0)]] = None
        sigma: Annotated[float, Field(ge=0)]
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
        weight: Annotated[float, Field(ge=0)]

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
                bad = [v for v in values if v < low]
                if bad:
                    raise problem("file", f"{self.file!r} with value {bad[0]:g}",
                                  f"{unit} >= {low:g}")
                self._values = values
            return self

    def shorthand(value):
        # `output_tokens: 128` (or `think_time: 5s`) means a fixed value.
        if isinstance(value, shorthand_types) and not isinstance(value, bool):
            return {"kind": "fixed", "value": value}
        return value

    union = Union[Fixed, Uniform, Normal, LogNormal, Empirical]
    return Annotated[union, Field(discriminator="kind"), BeforeValidator(shorthand)]


Tokens = Annotated[int, Field(ge=1)]
TokenDist = _dist_union(Tokens, 1, "token counts", (int, float, str))
TurnDist = _dist_union(Annotated[int, Field(ge=1, le=MAX_TURNS)], 1, "turn counts",
                       (int, float, str))
SecondsDist = _dist_union(Duration, 0, "seconds", (int, float, str))


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


class Slo(Strict):
    ttft_ms: Optional[Annotated[float, Field(gt=0)]] = None
    tpot_ms: Optional[Annotated[float, Field(gt=0)]] = None
    itl_ms: Optional[Annotated[float, Field(gt=0)]] = None
    e2e_ms: Optional[Annotated[float, Field(gt=0)]] = None

    def thresholds(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Sampling(Strict):
    temperature: Annotated[float, Field(ge=0)] = 0.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    ignore_eos: bool = True


class Session(Strict):
    turns: TurnDist
    think_time: SecondsDist = Field(default=0, validate_default=True)

    @model_validator(mode="after")
    def _bounded(self):
        if upper_bound(self.turns) == math.inf:
            raise problem("turns", "an unbounded distribution",
                          f"a distribution with max (at most {MAX_TURNS} turns)")
        return self


class ClassSpec(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    weight: Annotated[float, Field(ge=0)] = 1.0
    prompt_tokens: Optional[TokenDist] = None
    output_tokens: Optional[TokenDist] = None
    prefix_tokens: Annotated[int, Field(ge=0)] = 0
    prefix_groups: Optional[Annotated[int, Field(ge=1)]] = None
    session: Optional[Session] = None
    text: Literal[TEXT_SOURCES] = "modern"
    slo: Slo = Slo()
    sampling: Sampling = Sampling()

    @model_validator(mode="after")
    def _prefix(self):
        if self.prefix_groups is not None and self.prefix_tokens == 0:
            raise problem("prefix_groups", self.prefix_groups,
                          "prefix_groups only together with prefix_tokens > 0")
        return self

    @property
    def groups(self) -> int:
        """Number of shared-prefix groups (0 when the class has no shared prefix)."""
        if self.prefix_tokens == 0:
            return 0
        return self.prefix_groups or 1


class ConcurrencyPlan(Strict):
    levels: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]
    warmup: Duration = 0.0
    hold: PositiveDuration


class RatePlan(Strict):
    rates: Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)]
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    burstiness: Optional[Annotated[float, Field(gt=0)]] = None
    duration: PositiveDuration
    warmup: Duration = 0.0
    max_in_flight: Optional[Annotated[int, Field(ge=1)]] = None

    @model_validator(mode="after")
    def _burstiness(self):
        if self.arrival == "gamma" and self.burstiness is None:
            raise problem("burstiness", "nothing",
                          "a number > 0 with gamma arrivals (1 = Poisson, < 1 burstier, "
                          "> 1 smoother)")
        if self.arrival != "gamma" and self.burstiness is not None:
            raise problem("burstiness", self.burstiness,
                          f"burstiness only with arrival: gamma (found arrival: {self.arrival})")
        return self


class RampStage(Strict):
    users: Annotated[int, Field(ge=0)]
    spawn_rate: Annotated[float, Field(gt=0)]
    duration: PositiveDuration


class RampPlan(Strict):
    stages: Annotated[list[RampStage], Field(min_length=1)]


class TraceLimits(Strict):
    start: Duration = 0.0
    max_duration: Optional[PositiveDuration] = None
    max_requests: Optional[Annotated[int, Field(ge=1)]] = None


class TracePlan(Strict):
    file: str
    format: Literal["auto", "azure", "mooncake"] = "auto"
    time_scale: Annotated[float, Field(gt=0)] = 1.0
    max_in_flight: Optional[Annotated[int, Field(ge=1)]] = None
    limits: TraceLimits = TraceLimits()
    _rows: list = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _read(self, info: ValidationInfo):
        from servelab.profiles.trace import TraceFormatError, read_trace, select_rows

        path = _base_dir(info) / self.file
        try:
            rows = read_trace(path, self.format)
        except (OSError, TraceFormatError) as exc:
            raise problem("file", f"{self.file!r} ({exc})",
                          "an Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or "
                          "a Mooncake JSONL file (timestamp,input_length,output_length), "
                          "relative to the profile's folder") from None
        self._rows = select_rows(rows, self.time_scale, self.limits.start,
                                 self.limits.max_duration, self.limits.max_requests)
        if not self._rows:
            raise problem("limits", "no rows left after start/max_duration/max_requests",
                          "limits that keep at least one trace row")
        return self

    @property
    def rows(self) -> list:
        """Trace rows after limits, arrival_s scaled by time_scale and relative to the first."""
        return self._rows


PLAN_KINDS = ("concurrency", "rate", "ramp", "trace")


class LoadSpec(Strict):
    concurrency: Optional[ConcurrencyPlan] = None
    rate: Optional[RatePlan] = None
    ramp: Optional[RampPlan] = None
    trace: Optional[TracePlan] = None

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data):
        if isinstance(data, dict):
            given = [k for k in PLAN_KINDS if k in data]
            if len(given) > 1:
                raise problem(None, "plans " + ", ".join(given),
                              "exactly one of concurrency, rate, ramp, trace")
            if not given and not (set(data) - set(PLAN_KINDS)):
                raise problem(None, "no plan", "exactly one of concurrency, rate, ramp, trace")
        return data

    @property
    def kind(self) -> str:
        return next(k for k in PLAN_KINDS if getattr(self, k) is not None)

    @property
    def plan(self):
        return getattr(self, self.kind)


class Profile(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: Annotated[str, Field(min_length=1)]
    endpoint: Literal["chat", "completions"] = "chat"
    model: Annotated[str, Field(min_length=1)] = "auto"
    seed: Annotated[int, Field(ge=0)] = 0
    tokenizer: Optional[str] = None
    salt: bool = True
    classes: Annotated[list[ClassSpec], Field(min_length=1)]
    load: LoadSpec
    _path: Optional[Path] = PrivateAttr(default=None)
    _base_dir: Path = PrivateAttr(default=Path("."))

    @model_validator(mode="after")
    def _files(self, info: ValidationInfo):
        self._base_dir = _base_dir(info)
        if self.tokenizer is not None and not (self._base_dir / self.tokenizer).is_file():
            raise problem("tokenizer", f"{self.tokenizer!r} (no such file)",
                          "a path to a tokenizer.json, relative to the profile's folder")
        return self

    @property
    def path(self) -> Optional[Path]:
        return self._path

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def tokenizer_path(self) -> Optional[Path]:
        return None if self.tokenizer is None else self._base_dir / self.tokenizer

    def class_named(self, name: str) -> ClassSpec:
        return next(c for c in self.classes if c.name == name)
