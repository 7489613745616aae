"""The simulated vLLM engine core: ``step(now)`` schedules one batch and says how long it takes.

The engine is clock-free. The caller passes the step's start time; tokens produced by the step
become visible at ``now + duration``. The HTTP server drives it in real time, ``servelab.sim.engine.virtual``
without sleeping.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from servelab.core.errors import ServelabError
from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.cost_model import BatchShape, draft_cost_model, target_cost_model
from servelab.sim.engine.costs import calibrated_acceptance
from servelab.sim.engine.kv_offload import CPUTier, offload_block_manager
from servelab.sim.engine.kv_sizing import KVPlan, plan_kv_cache
from servelab.sim.engine.pipeline import AsyncPipeline
from servelab.sim.engine.scheduler import Scheduler
from servelab.sim.engine.sequence import Sequence, Status
from servelab.sim.engine.spec_decode import SpecDecoder
from servelab.sim.engine.startup_log import dialect
from servelab.specs.cost_calibration import CostParams
from servelab.specs.engine_config import EngineConfig

FINISH_REASONS = ("stop", "length", "abort")


def _block_manager(config: EngineConfig, plan: KVPlan) -> BlockManager:
    """Blocks of ``block_size`` tokens; a finer prefix-match granularity (SGLang's page_size 1)
    keeps its matching but allocates ``kv_page_tokens`` blocks out of the same KV tokens, so the
    engine does not track one block per token."""
    match = config.block_size
    page = max(match, config.kv_page_tokens or match)
    if page % match:
        page = match
    if config.kv_offload:
        if page != match:
            raise EngineStartupError(
                f"{config.server_kind}: CPU KV offloading is modelled for vLLM's block-granular "
                f"prefix cache only (this kind matches {match}-token runs); drop the offload flags")
        return offload_block_manager(config, plan.kv_tokens, match)
    return BlockManager(plan.kv_tokens // page, page, config.enable_prefix_caching, match)


class EngineStartupError(ServelabError):
    """vLLM would refuse to start (model does not fit, KV cache too small for max_model_len)."""


@dataclass
class TokenEvent:
    request_id: str
    new_tokens: int              # tokens in this chunk (several with speculative decoding)
    finished: bool
    finish_reason: str | None    # stop | length | abort, when finished
    num_output_tokens: int = 0   # cumulative, this chunk included


@dataclass
class StepOutput:
    duration_s: float
    events: list[TokenEvent] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)  # with their timings, for histograms
    shape: BatchShape = field(default_factory=BatchShape)   # what the step scheduled
    num_preempted: int = 0
    draft_s: float = 0.0


@dataclass
class EngineStats:
    """Counters and gauges that /metrics exports (names follow vLLM's)."""
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_gpu_blocks: int = 0
    num_preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    spec_num_drafts_total: int = 0
    spec_num_draft_tokens_total: int = 0
    spec_num_accepted_tokens_total: int = 0
    spec_accepted_per_pos_total: list[int] = field(default_factory=list)
    request_success_total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    num_steps_total: int = 0
    iteration_tokens_total: int = 0
    busy_time_s: float = 0.0


class Engine:
    def __init__(self, config: EngineConfig, seed: int = 0, engine_index: int = 0,
                 cost: CostParams | None = None):
        self.config = config
        self.params = cost or CostParams()
        self.seed = seed
        self.engine_index = engine_index
        self.kv_plan: KVPlan = plan_kv_cache(config)
        if self.kv_plan.errors:
            raise EngineStartupError(self.kv_plan.errors[0])
        self.startup_log: list[str] = dialect(config).startup_lines(config, self.kv_plan, seed)
        self.rng = random.Random(seed * 1_000_003 + engine_index)
        self.block_manager = _block_manager(config, self.kv_plan)
        # The CPU tier, when offloading: its counters are the offload metrics.
        self.offload: CPUTier | None = getattr(self.block_manager, "tier", None)
        k = config.num_speculative_tokens
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_model_len, num_lookahead_tokens=k,
                                   mixed=config.mixed_prefill_decode,
                                   policy=config.schedule_policy)
        self.cost = target_cost_model(config, self.params)
        # vLLM's async scheduling (on by default in 0.26); SGLang's overlap loop is not modelled.
        self.pipeline = AsyncPipeline(self.cost.params, enabled=config.server_kind == "vllm")
        self.spec = (SpecDecoder(config.speculative, draft_cost_model(config, self.params),
                                 self.params, self.rng, calibrated_acceptance(config))
                     if config.speculative else None)
        self.requests: dict[str, Sequence] = {}
        self._stats = EngineStats(num_gpu_blocks=self.kv_plan.num_blocks,
                                  spec_accepted_per_pos_total=[0] * k)

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids, max_tokens: int, min_tokens: int = 0,
                    ignore_eos: bool = False, eos_after: int | None = None, arrival_time: float = 0.0,
                    spec_acceptance: float | None = None) -> Sequence:
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} is already in the engine")
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("prompt must have at least one token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        limit = self.config.max_model_len
        if n + max_tokens > limit:
            # The server answers these with vLLM's 400 before they get here.
            raise ValueError(f"prompt ({n}) + max_tokens ({max_tokens}) exceeds max_model_len ({limit})")
        seq = Sequence(request_id, prompt_token_ids, max_tokens, min_tokens, ignore_eos, eos_after,
                       arrival_time, spec_acceptance, limit)
        seq.engine_index = self.engine_index
        if not self.has_unfinished():
            self.pipeline.idle()
        self.requests[request_id] = seq
        self.pipeline.add(seq, self.scheduler)
        return seq

    def abort_request(self, request_id: str, now: float | None = None) -> bool:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        if not self.pipeline.remove(seq):
            self.scheduler.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"
        seq.finish_time = now
        self._stats.request_success_total["abort"] += 1
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.pipeline.holding()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's ``reset_prefix_cache``: forget all cached blocks so that no later request hits.
        It fails (False, nothing changed) while requests hold blocks, unless
        ``reset_running_requests`` first preempts them (they recompute when admitted again)."""
        if reset_running_requests:
            self.scheduler.preempt_all()
        return self.block_manager.reset_prefix_cache()

    def get_sequence(self, request_id: str) -> Sequence | None:
        """An unfinished request's state (finished ones come back in ``StepOutput.finished``)."""
        return self.requests.get(request_id)

    @property
    def num_outstanding(self) -> int:
        return len(self.requests)

    @property
    def stats(self) -> EngineStats:
        s = self._stats
        sch, bm = self.scheduler, self.block_manager
        s.num_running = len(sch.running)
        s.num_waiting = sch.num_waiting
        s.kv_usage = bm.usage
        s.num_preemptions_total = sch.num_preemptions
        s.prefix_cache_queries_total = bm.query_tokens
        s.prefix_cache_hits_total = bm.hit_tokens
        if self.spec is not None:
            s.spec_num_drafts_total = self.spec.num_drafts
            s.spec_num_draft_tokens_total = self.spec.num_draft_tokens
            s.spec_num_accepted_tokens_total = self.spec.num_accepted_tokens
            s.spec_accepted_per_pos_total = list(self.spec.accepted_per_pos)
        return s

    # -- one engine step ------------------------------------------------------------------------
    def step(self, now: float) -> StepOutput:
        """Schedule a batch, price it, then account for the tokens it produced."""
        self.pipeline.release(now, self.scheduler)
        batch = self.scheduler.schedule(now)
        out = StepOutput(0.0, num_preempted=len(batch.preempted))
        if not batch.seqs:
            out.duration_s = self._spin_s(now)
            return out
        shape, spec_counts = self._shape(batch, now)
        duration = self.pipeline.duration(now, self.cost.step_time(shape), shape.num_seqs,
                                          shape.num_tokens, shape.prefill_tokens)
        # LMCache's copies run inside the step (before and after the forward pass).
        duration += self.block_manager.sync_stall_s(batch.seqs, batch.num_new_tokens)
        emitted = self._advance(batch, spec_counts)
        if self.spec is not None:
            # Drafting follows the target's forward in the same step: the step's tokens are
            # visible only once both are done.
            out.draft_s = self._draft_s(shape, emitted)
            duration += out.draft_s
        self._postprocess(emitted, now + duration, out)
        self._account(out, shape, duration)
        return out

    def _account(self, out: StepOutput, shape: BatchShape, duration: float) -> None:
        out.duration_s = duration
        out.shape = shape
        stats = self._stats
        stats.num_steps_total += 1
        stats.iteration_tokens_total += shape.num_tokens
        stats.busy_time_s += duration

    def _spin_s(self, now: float) -> float:
        """How long a step with nothing to compute lasts (0: the engine is idle)."""
        landing = self.scheduler.next_load_s()
        if landing is not None:
            # Only transfers are in flight: the loop polls until the first one lands.
            return max(self.params.t_cpu_s, landing - now)
        if self.scheduler.has_unfinished() or self.pipeline.holding():
            # Nothing fits this step (every request waits on blocks, or arrived after it was
            # decided: the next one, priced as after idle, takes them): the loop still spins.
            self.pipeline.idle()
            return self.params.t_cpu_s
        return 0.0

    def _shape(self, batch, now: float) -> tuple[BatchShape, list[int]]:
        """The batch as the cost model sees it, and the draft tokens each request verifies.
        Classified before any state changes: a request with exactly one uncomputed real token is
        decoding (plus the draft tokens it verifies); anything else is a prefill chunk."""
        shape = BatchShape()
        spec_counts = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            if seq.num_tokens - seq.num_computed_tokens == 1:
                shape.add_decode(seq.num_computed_tokens, n - 1)
                spec_counts.append(n - 1)
            else:
                shape.add_prefill(n, seq.num_computed_tokens)
                spec_counts.append(0)
        return shape, spec_counts

    def _advance(self, batch, spec_counts: list[int]) -> list[tuple[Sequence, int]]:
        """Count the batch's tokens as computed; each request that reached its end samples
        (its accepted drafts and one token) and proposes its next drafts. Returns those
        requests with the tokens each emits."""
        spec = self.spec
        emitted: list[tuple[Sequence, int]] = []
        for seq, n, k in zip(batch.seqs, batch.num_new_tokens, spec_counts):
            seq.num_computed_tokens += n
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prefill chunk that leaves more prompt for later steps
            accepted = spec.accept(k, seq.spec_acceptance) if (spec is not None and k > 0) else 0
            seq.num_computed_tokens -= k - accepted  # rejected drafts leave the cache
            new = min(accepted + 1, seq.remaining_output)
            seq.num_output_tokens += new
            seq.num_spec_tokens = 0
            emitted.append((seq, new))
            if spec is not None and seq.num_output_tokens < seq.stop_len:
                seq.num_spec_tokens = spec.propose()
        return emitted

    def _draft_s(self, shape: BatchShape, emitted) -> float:
        drafting = [seq for seq, _ in emitted if seq.num_spec_tokens]
        return self.spec.draft_time(shape, len(drafting), sum(s.num_tokens for s in drafting))

    def _postprocess(self, emitted, end: float, out: StepOutput) -> None:
        """The emitted tokens become visible at ``end``: timings, prefix-cache commits, finishes
        (their blocks freed) and the token events."""
        bm, stats = self.block_manager, self._stats
        bm.now = end  # the step's KV exists once it ends: write-through stores start then
        caching = bm.enable_caching
        block_size = bm.block_size
        # Finer matching makes a partly filled block matchable too: the first emission after a
        # prefill commits even when no block has filled since the last commit (there was none).
        commit_first = caching and bm.partial
        finished_any = False
        for seq, new in emitted:
            if seq.first_token_time is None:
                seq.first_token_time = end
                seq.prefill_done_time = end
                stats.prompt_tokens_total += seq.num_prompt_tokens
            seq.last_token_time = end
            stats.generation_tokens_total += new
            if caching and (seq.num_computed_tokens >= (seq.num_committed_blocks + 1) * block_size
                            or commit_first and seq.num_committed_blocks == 0):
                bm.commit(seq)
            finished = seq.num_output_tokens >= seq.stop_len
            if finished:
                self._finish(seq, end)
                out.finished.append(seq)
                finished_any = True
            out.events.append(TokenEvent(seq.request_id, new, finished,
                                         seq.finish_reason if finished else None,
                                         seq.num_output_tokens))
        if finished_any:
            self.scheduler.running = [s for s in self.scheduler.running if s.status is Status.RUNNING]

    def _finish(self, seq: Sequence, end: float) -> None:
        reason = seq.stop_reason
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finish_time = end
        seq.num_spec_tokens = 0
        self.block_manager.free_seq(seq)
        self.requests.pop(seq.request_id, None)
        self._stats.request_success_total[reason] += 1
