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

With every host coefficient 0 (the built-in defaults), a step costs its GPU time, as before.
"""
from __future__ import annotations

CUDAGRAPH_MAX_TOKENS = 512  # vLLM's max_cudagraph_capture_size default (the capture's log)


class AsyncPipeline:
    """Which waiting requests a step may take, and what the step costs on the host side."""

    def __init__(self, params, enabled: bool = True):
        self.enabled = enabled
        self.t_host = params.t_host_s
        self.t_host_seq = params.t_host_seq_s
        self.t_eager = params.t_eager_step_s
        self.t_idle = params.t_idle_step_s
        self.prev_start: float | None = None   # the running step's start (None: idle)
        self.last_end: float | None = None
        self.pending: list = []                # added after the running step was scheduled

    def add(self, seq, scheduler) -> None:
        """A new request: straight to the scheduler unless a step was already decided past it."""
        if self.enabled and self.prev_start is not None:
            self.pending.append(seq)
        else:
            scheduler.add(seq)

    def release(self, now: float, scheduler) -> None:
        """Before scheduling the step that starts at ``now``: an engine that was busy up to
        ``now`` decided this step at the previous one's start, so only requests that had arrived
        by then are in it; an idle engine takes every request."""
        if not self.pending:
            return
        cut = self.prev_start if self.prev_start is not None else now
        keep = []
        for seq in self.pending:
            if seq.arrival_time <= cut + 1e-12:
                scheduler.add(seq)
            else:
                keep.append(seq)
        self.pending = keep

    def remove(self, seq) -> bool:
        try:
            self.pending.remove(seq)
        except ValueError:
            return False
        return True

    def duration(self, now: float, gpu_s: float, num_seqs: int, num_tokens: int) -> float:
        """The step's wall time from ``now``: max(GPU, host) while the engine is busy (this
        step's host side ran during the previous one), host + GPU after idle."""
        host = self.t_host + self.t_host_seq * num_seqs
        if num_tokens > CUDAGRAPH_MAX_TOKENS:
            host += self.t_eager
        d = max(gpu_s, host) if self.last_end is not None else gpu_s + host + self.t_idle
        self.prev_start, self.last_end = now, now + d
        return d

    def idle(self) -> None:
        """The engine ran out of work: the next request finds it idle."""
        self.prev_start = None
        self.last_end = None
