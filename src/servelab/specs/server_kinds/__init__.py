"""Server kinds: one adapter module per LLM server framework (``vllm``, ``sglang``).

A variant names its kind (``server: vllm``, the default); everything that starts, generates,
checks or reads a server asks ``server_kind(variant.server)``. Adding a framework: write its
adapter module (command line, image, flags, log and ``/metrics`` grammar) and add it to KINDS.
"""
from __future__ import annotations

from servelab.core.errors import ServelabError
from servelab.specs.server_kinds.kind import (
    FLAG_CONCEPTS,
    SPECULATIVE_METHODS,
    LinearPath,
    ServerFacts,
    ServerKind,
)
from servelab.specs.server_kinds.sglang import SGLANG
from servelab.specs.server_kinds.vllm import VLLM

KINDS: dict[str, ServerKind] = {VLLM.name: VLLM, SGLANG.name: SGLANG}
DEFAULT_KIND = VLLM.name


def server_kind(name: str = DEFAULT_KIND) -> ServerKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ServelabError(f"unknown server kind {name!r}; known: {', '.join(KINDS)}") from None


__all__ = ["DEFAULT_KIND", "FLAG_CONCEPTS", "KINDS", "LinearPath", "SGLANG", "SPECULATIVE_METHODS",
           "ServerFacts", "ServerKind", "VLLM", "server_kind"]
