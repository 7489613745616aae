"""Traffic profiles: what is sent (request classes, lengths, prompts) and how load is applied.

Public entry points: ``load_profile`` (validated ``Profile``), ``planner.RequestPlanner`` (the
deterministic request sequence), ``prompts.PromptBuilder`` and ``tokens.make_counter``.

The entry points are imported on first use: the profile models (pydantic) take ~0.4 s to
build, and the simulator, which reads only the shipped corpus from this package, paid it at
every start.
"""
from __future__ import annotations

__all__ = ["Problem", "Profile", "ProfileError", "load_profile"]


def __getattr__(name: str):
    if name in ("Problem", "ProfileError", "load_profile"):
        from servelab.profiles import loader
        return getattr(loader, name)
    if name == "Profile":
        from servelab.profiles.schema import Profile
        return Profile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
