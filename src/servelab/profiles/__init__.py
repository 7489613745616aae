"""Traffic profiles: what is sent (request classes, lengths, prompts) and how load is applied.

Public entry points: ``load_profile`` (validated ``Profile``), ``planner.RequestPlanner`` (the
deterministic request sequence), ``prompts.PromptBuilder`` and ``tokens.make_counter``.
"""
from servelab.profiles.loader import Problem, ProfileError, load_profile
from servelab.profiles.schema import Profile

__all__ = ["Problem", "Profile", "ProfileError", "load_profile"]
