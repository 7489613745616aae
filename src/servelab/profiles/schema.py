"""The traffic-profile language as pydantic models: unknown keys are errors, unions are tagged.

Cross-field rules that concern one mapping (min <= max, exactly one of median/mean) live in that
model's validator and raise ``problem(field, found, allowed)`` so the loader can point at the
field. Rules that span the whole profile (weights, class names, trace vs lengths) are checked by
the loader on the raw YAML, so they are reported even when other parts fail to validate.
"""
# No `from __future__ import annotations`: pydantic must see the annotations as objects.
import math
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from servelab.profiles.dists import MAX_TURNS, SecondsDist, TokenDist, TurnDist
from servelab.profiles.fields import (Duration, PositiveDuration, Strict, Weight, problem,
                                      profile_folder)
from servelab.profiles.limits import (MAX_BURSTINESS, MAX_CLASSES, MAX_DURATION_S,
                                      MAX_PLANNED_REQUESTS, MAX_PREFIX_GROUPS, MAX_SEED,
                                      MAX_STAGES, MAX_TIME_SCALE, MAX_TOKENS, MAX_TURN_SLOTS,
                                      MAX_USERS, MIN_BURSTINESS)

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
TEXT_SOURCES = ("modern", "kjv", "code")
# Defined in dists and used from here by the tests.
__all__ = ["MAX_TURNS", "SecondsDist", "TokenDist", "TurnDist", "problem"]


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
        if self.turns.upper_bound() == math.inf:
            raise problem("turns", "an unbounded distribution",
                          f"a distribution with max (at most {MAX_TURNS} turns)")
        return self


class ClassSpec(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    weight: Weight = 1.0
    prompt_tokens: Optional[TokenDist] = None
    output_tokens: Optional[TokenDist] = None
    prefix_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    prefix_groups: Optional[Annotated[int, Field(ge=1, le=MAX_PREFIX_GROUPS)]] = None
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


Users = Annotated[int, Field(ge=1, le=MAX_USERS)]
InFlight = Optional[Annotated[int, Field(ge=1, le=MAX_PLANNED_REQUESTS)]]


class ConcurrencyPlan(Strict):
    levels: Annotated[list[Users], Field(min_length=1, max_length=MAX_STAGES)]
    warmup: Duration = 0.0
    hold: PositiveDuration


class RatePlan(Strict):
    rates: Annotated[list[Annotated[float, Field(gt=0)]],
                     Field(min_length=1, max_length=MAX_STAGES)]
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    # Below 0.01 almost every gamma gap underflows to 0 and arrival generation never ends.
    burstiness: Optional[Annotated[float, Field(ge=MIN_BURSTINESS, le=MAX_BURSTINESS)]] = None
    duration: PositiveDuration
    warmup: Duration = 0.0
    max_in_flight: InFlight = None

    @model_validator(mode="after")
    def _burstiness(self):
        if self.arrival == "gamma" and self.burstiness is None:
            raise problem("burstiness", "nothing",
                          "a number > 0 with gamma arrivals (1 = Poisson, < 1 burstier, "
                          "> 1 smoother)")
        if self.arrival != "gamma" and self.burstiness is not None:
            raise problem("burstiness", self.burstiness,
                          f"burstiness only with arrival: gamma (found arrival: {self.arrival})")
        planned = sum(self.rates) * (self.warmup + self.duration)
        if planned > MAX_PLANNED_REQUESTS:
            raise problem("rates", f"{planned:,.0f} planned requests (sum of rates x "
                          f"(warmup + duration))", f"at most {MAX_PLANNED_REQUESTS:,} planned "
                          "requests per run: lower the rates or the duration, or split the run")
        return self


class RampStage(Strict):
    users: Annotated[int, Field(ge=0, le=MAX_USERS)]
    spawn_rate: Annotated[float, Field(gt=0, le=MAX_USERS)]
    duration: PositiveDuration


class RampPlan(Strict):
    stages: Annotated[list[RampStage], Field(min_length=1, max_length=MAX_STAGES)]


class TraceLimits(Strict):
    start: Duration = 0.0
    max_duration: Optional[PositiveDuration] = None
    max_requests: InFlight = None


class TracePlan(Strict):
    file: str
    format: Literal["auto", "azure", "mooncake"] = "auto"
    time_scale: Annotated[float, Field(gt=0, le=MAX_TIME_SCALE)] = 1.0
    max_in_flight: InFlight = None
    limits: TraceLimits = TraceLimits()
    _rows: list = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _read(self, info: ValidationInfo):
        from servelab.profiles.trace import read_trace, select_rows

        path = profile_folder(info) / self.file
        try:
            rows = read_trace(path, self.format)
        except (OSError, ValueError) as exc:   # TraceFormatError, a file not UTF-8
            raise problem("file", f"{self.file!r} ({exc})",
                          "an Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or "
                          "a Mooncake JSONL file (timestamp,input_length,output_length), "
                          "relative to the profile's folder") from None
        self._rows = select_rows(rows, self.time_scale, self.limits.start,
                                 self.limits.max_duration, self.limits.max_requests)
        if not self._rows:
            raise problem("limits", "no rows left after start/max_duration/max_requests",
                          "limits that keep at least one trace row")
        if len(self._rows) > MAX_PLANNED_REQUESTS:
            raise problem("limits", f"{len(self._rows):,} trace rows", f"at most "
                          f"{MAX_PLANNED_REQUESTS:,} planned requests: set max_requests")
        span = self._rows[-1].arrival_s
        if not span <= MAX_DURATION_S:
            raise problem("time_scale", f"a replay of {span:g} s", f"at most "
                          f"{MAX_DURATION_S:.0f} s (31 days): lower time_scale or set "
                          "limits.max_duration")
        return self

    @property
    def rows(self) -> list:
        """Trace rows after limits, arrival_s scaled by time_scale and relative to the first."""
        return self._rows


PLAN_KINDS = ("concurrency", "rate", "ramp", "trace")
_PLAN_EXAMPLES = {"concurrency": "{levels: [1, 4], hold: 1m}",
                  "rate": "{rates: [1, 2], duration: 1m}",
                  "ramp": "{stages: [{users: 4, spawn_rate: 1, duration: 1m}]}",
                  "trace": "{file: traces/azure_conv_sample.csv}"}


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
            if len(given) == 1 and data[given[0]] is None:
                raise problem(given[0], "null", f"the {given[0]} plan's settings, e.g. "
                              + _PLAN_EXAMPLES[given[0]])
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
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    tokenizer: Optional[str] = None
    salt: bool = True
    classes: Annotated[list[ClassSpec], Field(min_length=1, max_length=MAX_CLASSES)]
    load: LoadSpec
    _path: Optional[Path] = PrivateAttr(default=None)
    _base_dir: Path = PrivateAttr(default=Path("."))

    @model_validator(mode="after")
    def _files(self, info: ValidationInfo):
        slots = sum(int(c.session.turns.upper_bound()) for c in self.classes if c.session)
        if slots > MAX_TURN_SLOTS:
            raise problem("classes", f"sessions with {slots:,} turns in all (the max turns of "
                          "every class with a session, summed)", f"at most {MAX_TURN_SLOTS:,}: "
                          "fewer classes with sessions or lower max turns")
        self._base_dir = profile_folder(info)
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
