"""Length, turn-count and time distributions of the profile language.

Each kind is one model (``parametric``, ``empirical``) that validates its parameters and knows
its sampler, its description and its largest value; a unit (``unit``) gives it number types and
bounds. Every sampler draws a whole array from a numpy Generator at once: the planner calls them
per block of requests, so one request costs well under a microsecond. Values outside [min, max]
are clipped (set to the bound), not redrawn.
"""
# No `from __future__ import annotations`: pydantic must see the annotations as objects.
from typing import Annotated, Union

from pydantic import BeforeValidator, Field, create_model

from servelab.profiles.dists.base import Distribution
from servelab.profiles.dists.empirical import Empirical
from servelab.profiles.dists.parametric import Fixed, LogNormal, Normal, Uniform
from servelab.profiles.dists.unit import MAX_TURNS, SECONDS, TOKENS, TURNS, Unit

KINDS = (Fixed, Uniform, Normal, LogNormal, Empirical)


def _of_unit(kind: type, unit: Unit) -> type:
    types = unit.types
    params = kind.__pydantic_generic_metadata__["parameters"]
    # A subclass per unit, so the unit is the model's own (parametrised models are cached).
    model = create_model(kind.__name__, __base__=kind[tuple(types[p] for p in params)],
                         __module__=kind.__module__)
    model.unit = unit
    return model


def _shorthand(value):
    # `output_tokens: 128` (or `think_time: 5s`) means a fixed value.
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


def distribution(unit: Unit):
    """The field type of a distribution of ``unit``: one of the kinds, tagged by ``kind``."""
    union = Union[tuple(_of_unit(kind, unit) for kind in KINDS)]
    return Annotated[union, Field(discriminator="kind"), BeforeValidator(_shorthand)]


TokenDist = distribution(TOKENS)
TurnDist = distribution(TURNS)
SecondsDist = distribution(SECONDS)


__all__ = ["MAX_TURNS", "Distribution", "SecondsDist", "TokenDist", "TurnDist"]
