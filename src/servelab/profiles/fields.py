"""Field types the profile models share: ``problem`` (a located error), ``Strict`` (unknown keys
and non-finite numbers are errors), durations and weights."""
# No `from __future__ import annotations`: pydantic must see the annotations as objects.
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from servelab.profiles.durations import ALLOWED as DURATION_ALLOWED
from servelab.profiles.durations import parse_duration
from servelab.profiles.limits import MAX_WEIGHT


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
Weight = Annotated[float, Field(ge=0, le=MAX_WEIGHT)]


class Strict(BaseModel):
    # No infinities or NaN anywhere: the planner and the summary do arithmetic on every number.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def profile_folder(info: ValidationInfo) -> Path:
    """The folder a profile's relative file names resolve against (the loader's context)."""
    ctx = info.context or {}
    return Path(ctx.get("base_dir") or ".")
