"""vLLM's per-iteration log line (``--enable-logging-iteration-details``): its one grammar, which
the simulator writes (``sim/server/iteration_log.py``) and the log reader parses
(``orchestration/iterations.py``).

vLLM 0.26 (``vllm/v1/metrics/loggers.py::LoggingStatLogger._log_iteration_details``), logged by
the API server's process when the engine core's outputs of that step arrive::

    INFO 12-01 20:54:32 [loggers.py:182] Engine 000: Iteration(1000): 0 context requests,
      0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time:
      2.54 ms, GPU KV cache usage: 0.3%

(one line), with `` (dummy)`` after the ms of a data-parallel dummy step and
``, encoder inputs: N, encoder output embeddings: M`` at the end of a multimodal one. Meaning
(``vllm/v1/engine/core.py::capture_iteration_details``, ``vllm/v1/utils.py::
compute_iteration_details``): the index counts the engine's steps with work (a 0-token step logs
nothing); a *context* request is one still in its prompt phase (a new request, or a chunk of a
chunked prefill), the others are *generation* requests; tokens are those scheduled in the step;
the elapsed time is only the wait for the model's output after scheduling (``future.result()``),
not the step's whole period (with async scheduling the next step's scheduling overlaps it); KV use
is the scheduler's ``kv_cache_usage`` after the step. The time stamp is the logger's
(``%m-%d %H:%M:%S``: whole seconds, no year, the server's local time zone).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

TIME_FORMAT = "%m-%d %H:%M:%S"
_LINE = re.compile(
    r"(?:(?P<level>[A-Z]+) (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? .*?)?"
    r"Engine (?P<engine>\d+): Iteration\((?P<index>\d+)\): "
    r"(?P<ctx_req>\d+) context requests, (?P<ctx_tok>\d+) context tokens, "
    r"(?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
    r"iteration elapsed time: (?P<elapsed>[0-9.]+) ms(?P<dummy> \(dummy\))?, "
    r"GPU KV cache usage: (?P<kv>[0-9.]+)%")


@dataclass(frozen=True)
class IterationLine:
    engine: int
    index: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float
    kv_cache_usage_pct: float
    dummy: bool
    stamp: str | None      # "MM-DD HH:MM:SS" as logged, or None when the line had no prefix


def format_iteration(engine: int, index: int, context_requests: int, context_tokens: int,
                     generation_requests: int, generation_tokens: int, elapsed_ms: float,
                     kv_cache_usage: float) -> str:
    """The message of one line, as vLLM 0.26 formats it (``kv_cache_usage`` a fraction)."""
    return (f"Engine {engine:03d}: Iteration({index}): {context_requests} context requests, "
            f"{context_tokens} context tokens, {generation_requests} generation requests, "
            f"{generation_tokens} generation tokens, iteration elapsed time: {elapsed_ms:.2f} ms, "
            f"GPU KV cache usage: {kv_cache_usage * 100:.1f}%")


def parse_iteration(line: str) -> IterationLine | None:
    """One log line's iteration details, or None when it is not an iteration line."""
    if "Iteration(" not in line:
        return None
    m = _LINE.search(line)
    if m is None:
        return None
    return IterationLine(int(m["engine"]), int(m["index"]), int(m["ctx_req"]), int(m["ctx_tok"]),
                         int(m["gen_req"]), int(m["gen_tok"]), float(m["elapsed"]),
                         float(m["kv"]), m["dummy"] is not None, m["stamp"])
