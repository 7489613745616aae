"""Fault injection for the load generator's tests (``servelab sim --faults SPEC``).

Grammar: a comma-separated list of ``KIND=RATE`` items, RATE a probability per request in [0, 1]::

    http429=0.05,http500=0.02,http503=0.01,stall=0.02:2.5s,cut=0.03,malformed=0.02,error_event=0.01

- ``http429`` / ``http500`` / ``http503``: the request is answered at once with that status and
  vLLM's error envelope (429 and 503 carry ``Retry-After: 1``); it never reaches the engine.
- ``stall=RATE:DURATION`` (``2.5s`` or ``250ms``): the stream pauses for DURATION between two
  content chunks (the tokens keep coming from the engine and are delivered after the pause).
- ``cut``: the connection is closed mid-stream, after some content and before ``[DONE]``.
- ``malformed``: one extra SSE frame whose data is truncated JSON is sent mid-stream; the stream
  then goes on normally.
- ``error_event``: mid-stream, vLLM's error frame ``data: {"error": {...}}`` is sent on the 200
  stream, followed by ``data: [DONE]``; the request is aborted in the engine.

Each request gets at most one fault: one uniform draw per request, in arrival order, from a
generator seeded with the server's ``--seed``, so a run is reproducible. The stream faults apply to
streaming requests only; a non-streaming request drawn for one is served normally. Where in the
stream a fault strikes is drawn with it: after a uniform fraction of the expected output tokens.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from servelab.core.errors import ServelabError

HTTP_KINDS = ("http429", "http500", "http503")
STREAM_KINDS = ("stall", "cut", "malformed", "error_event")
KINDS = HTTP_KINDS + STREAM_KINDS
_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(ms|s)$")
EXAMPLE = "http429=0.05,http500=0.02,stall=0.02:2.5s,cut=0.03,malformed=0.02,error_event=0.01"


@dataclass(frozen=True)
class FaultSpec:
    rates: dict[str, float]
    stall_s: float = 0.0

    @property
    def enabled(self) -> bool:
        return any(self.rates.values())


@dataclass(frozen=True)
class Fault:
    kind: str
    at_fraction: float  # where in the stream: fraction of the expected output tokens

    def strike_token(self, expected_tokens: int) -> int:
        """The stream fault strikes at the first chunk after the first whose tokens reach this
        count (so a fault never replaces the first token: TTFT stays measurable)."""
        return 1 + int(self.at_fraction * max(expected_tokens - 1, 0))


def parse_faults(spec: str | None) -> FaultSpec:
    """Parse ``--faults``; a bad spec raises ServelabError naming the item and the fix."""
    if not spec:
        return FaultSpec({})
    rates: dict[str, float] = {}
    stall_s = 0.0
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        kind, sep, value = item.partition("=")
        kind = kind.strip()
        where = f"--faults: item '{item}'"
        if not sep:
            raise ServelabError(f"{where}: expected KIND=RATE, e.g. {EXAMPLE}")
        if kind not in KINDS:
            raise ServelabError(f"{where}: unknown kind '{kind}'; allowed: {', '.join(KINDS)}")
        if kind in rates:
            raise ServelabError(f"{where}: '{kind}' is given twice; give each kind once")
        rate_text, colon, duration = value.partition(":")
        if kind == "stall":
            m = _DURATION.match(duration.strip())
            if not colon or not m:
                raise ServelabError(
                    f"{where}: stall needs a pause length, e.g. stall=0.02:2.5s or stall=0.02:500ms")
            stall_s = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        elif colon:
            raise ServelabError(f"{where}: only 'stall' takes a ':DURATION'; write {kind}=RATE")
        try:
            rate = float(rate_text)
        except ValueError:
            raise ServelabError(f"{where}: rate '{rate_text}' is not a number; use 0 to 1") from None
        if not 0.0 <= rate <= 1.0:
            raise ServelabError(f"{where}: rate {rate} is outside 0 to 1 (a probability per request)")
        rates[kind] = rate
    total = sum(rates.values())
    if total > 1.0 + 1e-9:
        raise ServelabError(
            f"--faults: the rates add up to {total:g}; each request gets at most one fault, so "
            "their sum must be at most 1")
    return FaultSpec(rates, stall_s)


class FaultPlan:
    """Draws each request's fault in arrival order; deterministic for a seed."""

    def __init__(self, spec: FaultSpec, seed: int):
        self.spec = spec
        self._rng = random.Random(f"servelab-faults-{seed}")
        self._cumulative = []
        acc = 0.0
        for kind in KINDS:
            rate = spec.rates.get(kind, 0.0)
            if rate > 0:
                acc += rate
                self._cumulative.append((acc, kind))

    def draw(self) -> Fault | None:
        if not self._cumulative:
            return None
        u = self._rng.random()
        at = self._rng.random()
        for bound, kind in self._cumulative:
            if u < bound:
                return Fault(kind, at)
        return None
