"""Which start-up log the simulator writes: the one of the variant's server kind.

The lines themselves belong to the kind (``specs.server_kinds.<kind>.sim_log``: vLLM's release
wording, SGLang's); the simulator only asks for them, so a new kind needs no edit here.
"""
from __future__ import annotations

from servelab.specs.engine_config import EngineConfig
from servelab.specs.server_kinds import VLLM, SimDialect, server_kind


def dialect(config: EngineConfig) -> SimDialect:
    """The kind's ``SimDialect``; vLLM's where the kind brings none (the simulator's own)."""
    return server_kind(config.server_kind).sim_log or VLLM.sim_log
