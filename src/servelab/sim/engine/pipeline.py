"""vLLM's async scheduling, as the engine's step timing sees it (issue 22).

vLLM 0.26 enables async scheduling by default ("Asynchronous scheduling is enabled." in the
start-up log). ``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py) keeps a batch queue
of two: it schedules step k+1 and launches it *before* it blocks on step k's result, so

- the host work of a step (``Scheduler.schedule``, input preparation, the launch, and
  ``update_from_output`` of the step before) runs while the GPU computes the previous step:
  back to back, a step takes ``max(gpu, host)``, and vLLM's logged ``elapsed_ms`` is only the
  ``future.result()`` wait that ``capture_iteration_details`` wraps, not the step. The 2026-12-02
  H200 capture's decode-only seconds put the host side at 2.5 ms + 40 us per running request
  (``t_host_s``, ``t_host_seq_s``; bench/fit_h200_engine.py);
- an idle engine has nothing to overlap with: a request that finds it idle pays
  ``host + gpu``, plus ``t_idle_step_s``, the wake-up of a loop that was blocked in
  ``EngineCore._process_input_queue`` on ``input_queue.get()`` (no work: it blocks) and of a GPU
  that sat idle: the capture's 1-user prefill spans (first scheduled -> first token) sit 4-6 ms
  above host + GPU for every prompt length;
- the batch that runs from ``now`` was decided when the previous step started: a request that
  arrived after that start joins the step after next (one step later than an idle or
  synchronous engine would take it). ``Scheduler.schedule`` then gives decodes their tokens
  first and the waiting requests the rest of ``max_num_batched_tokens`` (``sim.engine.scheduler``).

A step of more tokens than the largest CUDA graph (``max_cudagraph_capture_size``, 512 on this
config: the capture's compilation_config) is launched piecewise without a graph: its host side
gains ``t_eager_step_s``, hidden behind the previous step under load, paid in full at idle.

New requests reach the scheduler through the engine core's input thread (issue 22, fifth pass).
``EngineCoreProc.process_input_sockets`` (vllm/v1/engine/core.py) runs in a thread of its own:
it polls the socket, receives, decodes the msgpack and runs ``preprocess_add_request`` before
``input_queue.put``, taking the GIL several times a request. While the busy loop does host work
that thread gets the GIL about once per switch interval (CPython's ``sys.getswitchinterval()``,
5 ms); while the loop waits on the GPU (``future.result()`` releases the GIL) it runs freely.
So a request that arrives while steps are host-bound needs ``input_gil_turns`` turns, one per
``SWITCH_INTERVAL_S`` of host work (or per GPU wait), and a GPU wait of at least
``input_free_wait_s`` lets every queued request through: requests pile up in host-bound decode
stretches and flood in after a step that waits on the GPU, as the capture's iteration lines show
(runs of decode-only steps with nothing admitted, then bursts). ``input_gil_turns`` 0 (the
default and every file without it): requests reach the scheduler as they arrive.

The host side also grows with the prompt tokens a step schedules (issue 22, sixth pass):
``GPUModelRunner._prepare_inputs`` (vllm/v1/worker/gpu_model_runner.py) builds per-token CPU
arrays for every scheduled token (the request index by ``np.repeat``, the positions, the token
indices ``torch.index_select`` gathers into ``input_ids.cpu[:total_num_scheduled_tokens]``),
``block_table.compute_slot_mapping`` maps each of those positions to its KV slot, and
``commit_slot_mapping`` / ``copy_to_gpu`` move them over; the scheduler's
``KVCacheManager.allocate_slots`` takes a block per 16 new tokens and a new request's prompt is
copied into ``InputBatch.token_ids_cpu``. A decode adds one token, a prefill chunk hundreds.
The capture's busy seconds record it (1 s less the second's ``elapsed_ms`` waits is the loop's
host work: fp8 phases 64 users 6.7 ms a step against 5.0 from the per-step and per-request
terms), so a busy step's host side adds ``t_host_prompt_token_s`` per scheduled prompt token
(bench/fit_h200_engine.py). An idle engine's prefill keeps the host side the 1-user spans were
fitted with (``t_idle_step_s`` and ``eta_compute`` took that prompt-length work in).

With every host coefficient 0 (the built-in defaults), a step costs its GPU time, as before.
"""
from __future__ import annotations

CUDAGRAPH_MAX_TOKENS = 512  # vLLM's max_cudagraph_capture_size default (the capture's log)
SWITCH_INTERVAL_S = 0.005   # CPython's default sys.getswitchinterval()


class AsyncPipeline:
    """Which waiting requests a step may take, and what the step costs on the host side."""

    def __init__(self, params, enabled: bool = True):
        self.enabled = enabled
        self.t_host = params.t_host_s
        self.t_host_seq = params.t_host_seq_s
        self.t_host_prompt = params.t_host_prompt_token_s
        self.t_eager = params.t_eager_step_s
        self.t_idle = params.t_idle_step_s
        self.gil_turns = params.input_gil_turns if enabled else 0.0
        self.free_wait = params.input_free_wait_s
        self.prev_start: float | None = None   # the running step's start (None: idle)
        self.last_end: float | None = None
        self.pending: list = []                # (ready time, seq) past the running step's decision
        self.inbox: list = []                  # [seq, turns left]: still in the input thread
        self.credit = 0.0                      # the input thread's GIL turns not yet spent
        self.last_host: tuple | None = None    # (start, host seconds) of the step just run

    def add(self, seq, scheduler) -> None:
        """A new request: straight to the scheduler unless a step was already decided past it
        (or, with the input thread modelled, unless that thread must first win the GIL)."""
        if not self.enabled or self.prev_start is None:
            scheduler.add(seq)
        elif self.gil_turns:
            self.inbox.append([seq, self.gil_turns])
        else:
            self.pending.append((seq.arrival_time, seq))

    def holding(self) -> bool:
        return bool(self.pending or self.inbox)

    def release(self, now: float, scheduler) -> None:
        """Before scheduling the step that starts at ``now``: an engine that was busy up to
        ``now`` decided this step at the previous one's start, so only requests that had arrived
        by then are in it; an idle engine takes every request."""
        if self.inbox and self.last_host is not None:
            self._input_thread(*self.last_host, now)
        self.last_host = None
        if self.inbox and not scheduler.has_unfinished() and not self.pending:
            self._through(len(self.inbox), now)   # the loop blocks on input_queue: no GIL held
        if not self.pending:
            return
        cut = self.prev_start if self.prev_start is not None else now
        keep = []
        for ready, seq in self.pending:
            if ready <= cut + 1e-12:
                scheduler.add(seq)
            else:
                keep.append((ready, seq))
        self.pending = keep

    def remove(self, seq) -> bool:
        for i, (_, held) in enumerate(self.pending):
            if held is seq:
                del self.pending[i]
                return True
        for i, (held, _) in enumerate(self.inbox):
            if held is seq:
                del self.inbox[i]
                return True
        return False

    def _through(self, n: int, t: float) -> None:
        """The first ``n`` requests of the input thread reach ``input_queue`` at ``t``."""
        for seq, _ in self.inbox[:n]:
            self.pending.append((max(t, seq.arrival_time), seq))
        del self.inbox[:n]
        if not self.inbox:
            self.credit = 0.0

    def _input_thread(self, now: float, host: float, end: float) -> None:
        """The input thread from the last step's start ``now`` to the next one's, ``end``: the
        loop's host work first (a GIL turn per switch interval), then its wait on the GPU or
        for the API server (free for the thread once long enough)."""
        arrived = sum(1 for seq, _ in self.inbox if seq.arrival_time <= end)
        wait = end - now - host
        if wait >= self.free_wait:
            self._through(arrived, now + host)
            return
        self.credit += host / SWITCH_INTERVAL_S + (wait > 1e-9)
        done = 0
        for entry in self.inbox[:arrived]:
            spend = min(self.credit, entry[1])
            entry[1] -= spend
            self.credit -= spend
            if entry[1] > 1e-9:
                break
            done += 1
        self._through(done, end)

    def duration(self, now: float, gpu_s: float, num_seqs: int, num_tokens: int,
                 prompt_tokens: int = 0) -> float:
        """The step's wall time from ``now``: max(GPU, host) while the engine is busy (this
        step's host side ran during the previous one), host + GPU after idle."""
        host = self.t_host + self.t_host_seq * num_seqs
        if self.last_end is not None:   # at idle the 1-user spans' fit (t_idle_step_s) has it
            host += self.t_host_prompt * prompt_tokens
        if num_tokens > CUDAGRAPH_MAX_TOKENS:
            host += self.t_eager
        d = max(gpu_s, host) if self.last_end is not None else gpu_s + host + self.t_idle
        self.prev_start, self.last_end = now, now + d
        self.last_host = (now, host)
        return d

    def idle(self) -> None:
        """The engine ran out of work: the next request finds it idle."""
        self.prev_start = None
        self.last_end = None
