"""What a server really runs, read from its start-up log and its Prometheus ``/metrics``.

The grammar belongs to the server's kind (``specs.server_kinds``: vLLM's kernel lines, engine
config and metric names live in ``server_kinds/vllm_log.py``); this is where orchestration and the
tests ask for it, naming the kind (``vllm`` unless told).
"""
from __future__ import annotations

from servelab.specs.server_kinds import DEFAULT_KIND, ServerFacts, server_kind

__all__ = ["ServerFacts", "parse_log", "parse_metrics"]


def parse_log(text: str, facts: ServerFacts | None = None,
              server: str = DEFAULT_KIND) -> ServerFacts:
    return server_kind(server).parse_log(text, facts)


def parse_metrics(text: str, facts: ServerFacts | None = None,
                  server: str = DEFAULT_KIND) -> ServerFacts:
    """Read what ``/metrics`` confirms: cache config, engines, speculative counters."""
    return server_kind(server).parse_metrics(text, facts)
