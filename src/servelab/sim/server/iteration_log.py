"""The simulator's ``--enable-logging-iteration-details``: one vLLM 0.26 iteration line per engine
step with work, same grammar and meaning (``specs/iteration_log.py``), so a simulated run's log
fills ``server_iterations`` as a real server's does.

What each field is here: context = the step's prefill chunks (``StepOutput.shape.num_prefill`` /
``prefill_tokens``), generation = its decodes, elapsed = the step's simulated model time
(``duration_s``: vLLM measures the wait for the forward pass, which the simulated step is), KV use
= the block manager's after the step. The index counts steps with scheduled tokens, per engine.

The serving loop only formats the line and appends it to a buffer; the buffer is written at most
every ``flush_s`` (and when it holds ``max_lines``), so a 256-stream run pays one ``write`` per
100 ms instead of one flushed ``print`` per step. Measured: tests/sim_server/test_iteration_log.py.
"""
from __future__ import annotations

import asyncio
import sys
import time

from servelab.specs.iteration_log import TIME_FORMAT, format_iteration


class IterationLog:
    def __init__(self, write=None, flush_s: float = 0.1, max_lines: int = 512):
        self._write = write or _stdout
        self.flush_s = flush_s
        self.max_lines = max_lines
        self.index: dict[int, int] = {}
        self.lines: list[str] = []
        self._second = -1
        self._stamp = ""
        self._timer = None

    def record(self, engine: int, out, kv_usage: float) -> None:
        if not out.shape.num_tokens:
            return   # vLLM logs no 0-token step
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime(TIME_FORMAT, time.localtime(second))
        i = self.index.get(engine, 0)
        self.index[engine] = i + 1
        self.lines.append(f"INFO {self._stamp} [loggers.py:182] " + format_iteration(
            engine, i, out.shape.num_prefill, out.shape.prefill_tokens, out.shape.num_decode,
            out.shape.decode_tokens, out.duration_s * 1e3, kv_usage))
        if len(self.lines) >= self.max_lines:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:   # no loop (a test driving it by hand): write now
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.lines:
            text = "\n".join(self.lines) + "\n"
            self.lines = []
            self._write(text)


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def attach(server) -> IterationLog | None:
    """One log for every engine of a vLLM-dialect server (SGLang prints no such lines: None)."""
    if server.config.server_kind != "vllm":
        return None
    log = IterationLog()
    for driver in server.drivers:
        driver.iteration_log = log
    return log
