"""The API server's CPU in front of and behind the engine (issue 22).

vLLM's API server is one Python process. Its asyncio loop (one CPU: the GIL) runs the
``output_handler`` task of ``AsyncLLM._run_output_handler`` (vllm/v1/engine/async_llm.py): for
every engine step it pulls the step's outputs and ``OutputProcessor.process_outputs``
detokenizes them and pushes each into its request's queue, whose ``generate()`` coroutine wakes
and writes one SSE chunk; under load that work is always runnable. A new request's own work
(HTTP parse, validation, ``InputProcessor.process_inputs_async``'s tokenizing, then
``AsyncLLM.add_request`` -> the engine core's input socket) gets the loop between those jobs
and a share of it while they run (the handler yields between output slices). Tokenizing runs
in a worker thread, but the Python around the tokenizer holds the same GIL, so it is priced as
loop time: the 2026-12-02 capture's API-server CPU is 0.175 cores + 49 us per streamed chunk +
8.6 us per prompt token (least squares over 28 stages, within +-0.1 core), and at 256 users
(bf16 code_gen, 13,098 chunks/s) the loop is saturated: requests wait 762 ms (median) between
the API server's arrival and the engine while the engine queue is empty.

The model, clock-free like the engine:

- ``step_out(t, chunks)``: a step that ended at ``t`` has its outputs processed first come first
  served on the loop, ``api_step_s + chunks * api_chunk_s`` each; its chunks leave when done.
- ``gate()``: the engine starts a step only once the outputs of the step before the previous one
  have been processed: a saturated loop paces the engine instead of piling up unbounded output.
- ``request_in(t, prompt_tokens)``: the request's ``api_request_s + prompt_tokens *
  api_prompt_token_s`` of loop work is served first come first served among new requests, in
  full in the gaps between output jobs and at ``INPUT_SHARE`` during them, computed exactly over
  the output jobs known so far: the answer is a lower bound that ``ready(job, t)`` revisits once
  later output jobs are known. It cannot run away (the replaced 1 / (1 - utilisation) stretch
  froze a request's slowdown at its arrival and queued every later one behind it): the wait is
  the backlog served at the loop's real leftover, and as soon as output load falls (a long
  prefill step emits one chunk per request in ~150 ms) the backlog drains, which hands new
  requests to the engine in bursts as the capture's iteration lines show (8-10 full 8,192-token
  prefill steps, then ~40 decode-only ones, at 128 users).
- The hand-off costs more on a busy loop (issue 22, third pass). vLLM tokenizes in a thread of
  its own (``AsyncMicrobatchTokenizer``, vllm/utils/async_utils.py: "A single-thread
  ThreadPoolExecutor is used so the event loop stays responsive"), whose result resumes the
  request's coroutine through the loop. On an idle loop that thread overlaps the rest of the
  hand-off, so only part of a prompt token's CPU is on the request's path: the 1-user spans'
  "server other" grows 2.6-3.1 us a prompt token (tests/sim_engine/test_capture_gaps.py), the
  CPU fit says 8.6 us. A loop busy with output holds the GIL that thread needs (CPython hands
  it over only when the loop blocks or after ``sys.getswitchinterval()``) and runs the
  resumption after every ready stream's chunk, so the whole per-token CPU comes onto the path:
  ``api_prompt_token_s`` at an idle loop, plus ``api_busy_prompt_token_s`` times
  min(1, load / ``api_busy_full_load``), where load is the share of the last ``LOAD_WINDOW_S``
  the loop spent on output jobs. Bounded (at most the CPU fit's 8.6 us a token), so it cannot
  run away; ``api_busy_full_load`` is fitted to the spans' "to server" + "server other" per
  load level by bench/fit_hand_off.py (tests/sim_engine/test_capture_hand_off.py). The spans
  cannot say which await of the path waits (they stamp only arrival, queue, first token): the
  GIL reading is the one that fits both the idle spans and the CPU fit.

With every api_* coefficient 0 (the built-in defaults) the stage costs nothing.
"""
from __future__ import annotations

from collections import deque

EPS = 1e-9
# What a new request gets of the loop while an output job runs: the output handler yields
# between VLLM_V1_OUTPUT_PROC_CHUNK_SIZE slices (``await asyncio.sleep(0)``) and each stream's
# chunk is written by its own coroutine, so ready request coroutines take turns in between.
INPUT_SHARE = 0.02
# The window over which a new request reads the loop's output load: about one engine step at
# 64-256 users (16-25 ms in the 2026-12-02 capture's iteration lines).
LOAD_WINDOW_S = 0.02


class InputJob:
    __slots__ = ("loop_at", "work", "end")

    def __init__(self, loop_at: float, work: float):
        self.loop_at = loop_at        # reached the server: its loop work may start
        self.work = work              # loop seconds before the hand-off to the engine
        self.end: float | None = None  # final once it is not after the last revisit


class APIServer:
    def __init__(self, params):
        self.request_s = params.api_request_s
        self.token_s = params.api_prompt_token_s
        self.chunk_s = params.api_chunk_s
        self.step_s = params.api_step_s
        self.busy_token_s = params.api_busy_prompt_token_s
        self.full_load = params.api_busy_full_load
        self.enabled = any((self.request_s, self.token_s, self.chunk_s, self.step_s))
        self._recent: deque = deque()  # (start, end) of output jobs, the last LOAD_WINDOW_S
        self.out_free = 0.0           # when output processing catches up
        self._done: deque = deque([0.0, 0.0], maxlen=2)  # output-processed times of the last two steps
        self._busy: deque = deque()   # (start, end) of output jobs not yet behind every input
        self._inputs: deque[InputJob] = deque()   # loop work of new requests, oldest first
        self._in_t = 0.0              # the loop's input work is accounted up to here
        self.last_job: InputJob | None = None   # the last request_in's, for ready()

    def step_out(self, t: float, chunks: int) -> float:
        """When the chunks of a step that ended at ``t`` leave the server."""
        if not self.enabled:
            return t
        start = max(t, self.out_free)
        end = start + self.step_s + chunks * self.chunk_s
        self.out_free = end
        self._done.append(end)
        if end > start:
            self._busy.append((start, end))
            if self.busy_token_s:
                self._recent.append((start, end))
        return end

    def load(self, t: float) -> float:
        """The share of the ``LOAD_WINDOW_S`` before ``t`` the loop spent on output jobs."""
        lo = t - LOAD_WINDOW_S
        recent = self._recent
        while recent and recent[0][1] <= lo:
            recent.popleft()
        return sum(max(0.0, min(e, t) - max(s, lo)) for s, e in recent) / LOAD_WINDOW_S

    def hand_off_work(self, t: float, prompt_tokens: int) -> float:
        """The loop work on a new request's path: more per prompt token on a busy loop."""
        token_s = self.token_s
        if self.busy_token_s:
            load = self.load(t)
            share = min(1.0, load / self.full_load) if self.full_load > 0 else float(load > 0)
            token_s += share * self.busy_token_s
        return self.request_s + prompt_tokens * token_s

    def gate(self) -> float:
        """The earliest start of the engine's next step (the step before last processed)."""
        return self._done[0] if self.enabled else 0.0

    def reset_gate(self) -> None:
        """The engine went idle: its next step waits for no earlier output."""
        self._done.extend((0.0, 0.0))

    def request_in(self, t: float, prompt_tokens: int) -> float:
        """When a request that reached the server at ``t`` is handed to the engine, as far as
        the output jobs known now say (``last_job`` then names it for ``ready``)."""
        if not self.enabled:
            self.last_job = None
            return t
        job = InputJob(t, self.hand_off_work(t, prompt_tokens))
        self._inputs.append(job)
        self.last_job = job
        self._settle(t)
        return job.end

    def ready(self, job: InputJob | None, t: float) -> float:
        """The hand-off time of ``job`` given every output job known at ``t`` (``t`` or earlier:
        it is done; later: revisit then)."""
        if job is None:
            return t
        self._settle(t)
        return job.end

    def _settle(self, now: float) -> None:
        """Serve the input queue, in order, around the known output jobs; a job done by ``now``
        is final (an output job not known yet starts at a step end, never before the present)
        and leaves the queue."""
        t = self._in_t
        for job in self._inputs:
            t = job.end = self._serve(max(t, job.loop_at), job.work)
        inputs = self._inputs
        while inputs and inputs[0].end <= now + EPS:
            self._in_t = inputs.popleft().end
        if not inputs:   # nothing waits: output jobs before now can be forgotten
            self._in_t = max(self._in_t, now)
        busy = self._busy
        while len(busy) > 1 and busy[0][1] <= self._in_t:
            busy.popleft()

    def _serve(self, start: float, work: float) -> float:
        """When ``work`` seconds of loop time begun at ``start`` are done: all of the loop in the
        gaps between output jobs, ``INPUT_SHARE`` of it during one."""
        t = start
        if work <= 0:
            return t
        for s, e in self._busy:
            if e <= t:
                continue
            if s > t:
                if t + work <= s + EPS:
                    return t + work
                work -= s - t
                t = s
            if (e - t) * INPUT_SHARE >= work:
                return t + work / INPUT_SHARE
            work -= (e - t) * INPUT_SHARE
            t = e
        return t + work
