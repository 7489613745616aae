"""The API server's CPU as a queueing stage in front of and behind the engine (issue 22).

vLLM's API server is one Python process whose asyncio loop does, for every request, the HTTP
parse, validation and tokenizing (``OpenAIServingCompletion`` -> ``InputProcessor``, then
``AsyncLLM.add_request`` sends it to the engine core), and for every engine step the
``output_handler`` task of ``vllm/v1/engine/async_llm.py``: ``OutputProcessor.process_outputs``
detokenizes each request's new tokens (``output_processor.py``) and hands them to the request's
stream, which formats and writes one SSE chunk. With the GIL, that is one CPU: the capture of
2026-12-01 (H200, vLLM 0.26) shows the API server's CPU rising with streamed chunks and prompt
tokens (16% at 1 user, 110% mean at 256 users) while client TTFT at 256 users spent 1.3 s
between the API server's arrival and the engine's queue (the spans' TTFT minus queue and
prefill) and the engine stepped at the API server's pace (27.8 ms decode-only steps at ~240
running requests, against a GPU roofline of ~9 ms).

The model, clock-free like the engine:

- ``step_out(t, chunks)``: the outputs of a step that ended at ``t`` are processed first come
  first served, ``api_step_s + chunks * api_chunk_s`` each; its chunks leave when that is done.
- ``gate()``: the engine starts a step only once the outputs of the step before the previous one
  have been processed (two steps in flight, like the engine core's batch queue): a saturated API
  server paces the engine instead of piling up unbounded output.
- ``request_in(t, prompt_tokens)``: a new request's work, ``api_request_s + prompt_tokens *
  api_prompt_token_s``, gets the CPU that output processing leaves (the output handler is always
  runnable under load; new requests' tasks wait behind it): its service is stretched by
  1 / (1 - recent output utilisation). The request reaches the engine when it is done.

With every api_* coefficient 0 (the built-in defaults) the stage costs nothing.
"""
from __future__ import annotations

from collections import deque

WINDOW_S = 0.25       # the output utilisation that slows new requests is measured over this
MIN_SHARE = 0.05      # new requests always get some CPU (the loop interleaves ready tasks)


class APIServer:
    def __init__(self, params):
        self.request_s = params.api_request_s
        self.token_s = params.api_prompt_token_s
        self.chunk_s = params.api_chunk_s
        self.step_s = params.api_step_s
        self.enabled = any((self.request_s, self.token_s, self.chunk_s, self.step_s))
        self.out_free = 0.0           # when output processing catches up
        self.in_free = 0.0            # when the new-request queue catches up
        self._done: deque = deque([0.0, 0.0], maxlen=2)  # output-processed times of the last two steps
        self._busy: deque = deque()   # (start, end) of recent output jobs

    def step_out(self, t: float, chunks: int) -> float:
        """When the chunks of a step that ended at ``t`` leave the server."""
        if not self.enabled:
            return t
        start = max(t, self.out_free)
        end = start + self.step_s + chunks * self.chunk_s
        self.out_free = end
        self._done.append(end)
        self._busy.append((start, end))
        return end

    def gate(self) -> float:
        """The earliest start of the engine's next step (the step before last processed)."""
        return self._done[0] if self.enabled else 0.0

    def reset_gate(self) -> None:
        """The engine went idle: its next step waits for no earlier output."""
        self._done.extend((0.0, 0.0))

    def utilisation(self, t: float) -> float:
        lo = t - WINDOW_S
        busy = self._busy
        while busy and busy[0][1] <= lo:
            busy.popleft()
        used = sum(min(e, t) - max(s, lo) for s, e in busy if s < t)
        return min(1.0, max(0.0, used / WINDOW_S))

    def request_in(self, t: float, prompt_tokens: int) -> float:
        """When a request that reached the server at ``t`` is handed to the engine."""
        if not self.enabled:
            return t
        work = self.request_s + prompt_tokens * self.token_s
        share = max(MIN_SHARE, 1.0 - self.utilisation(t))
        start = max(t, self.in_free)
        self.in_free = start + work / share
        return self.in_free
