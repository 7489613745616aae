"""Server kinds: one package per LLM server framework (``vllm/``, ``sglang/``), one registry.

A variant names its kind (``server: vllm``, the default); everything that starts, generates,
checks, simulates or reads a server asks ``server_kind(variant.server)``. A kind's package holds
all of it: serve flags and checks, log and ``/metrics`` grammar, metric names, the simulator's
scheduling knobs and the start-up log and ``/metrics`` the simulator writes in its words; its
``__init__`` names the ``KIND``. Adding a framework is adding its package here: ``KINDS`` finds
every package under this one, so nothing else is edited.
"""
from __future__ import annotations

import importlib
import pkgutil

from servelab.core.errors import ServelabError
from servelab.specs.server_kinds.kind import (
    FLAG_CONCEPTS,
    SPECULATIVE_METHODS,
    LinearPath,
    ServerFacts,
    ServerKind,
    SimDialect,
)


def find_kinds(path=None) -> dict[str, ServerKind]:
    """Every package under ``path`` (this package's folders) that names a ``KIND``; vLLM first,
    the default, then by name so messages list them in a fixed order."""
    found = {}
    for module in pkgutil.iter_modules(__path__ if path is None else path):
        if module.ispkg:
            kind = importlib.import_module(f"{__name__}.{module.name}").KIND
            found[kind.name] = kind
    return dict(sorted(found.items(), key=lambda item: (item[0] != "vllm", item[0])))


KINDS: dict[str, ServerKind] = find_kinds()
DEFAULT_KIND = "vllm"
VLLM, SGLANG = KINDS["vllm"], KINDS["sglang"]


def server_kind(name: str = DEFAULT_KIND) -> ServerKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ServelabError(f"unknown server kind {name!r}; known: {', '.join(KINDS)}") from None


def tracing_of(kind: ServerKind):
    """The kind package's ``TRACING`` (how it is told where spans go, which body field names a
    request: SWITCHES, ENDPOINT_FLAG, ENV, REQUEST_ID_FIELD), or None: vLLM's way (the flag,
    the X-Request-Id header). A kind made outside this package (a test's) has none."""
    try:
        package = importlib.import_module(f"{__name__}.{kind.name}")
    except ImportError:
        return None
    return getattr(package, "TRACING", None)


__all__ = ["DEFAULT_KIND", "FLAG_CONCEPTS", "KINDS", "LinearPath", "SGLANG", "SPECULATIVE_METHODS",
           "ServerFacts", "ServerKind", "SimDialect", "VLLM", "find_kinds", "server_kind", "tracing_of"]
