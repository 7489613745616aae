"""The engine's scheduling policy, one step at a time.

Mixed (vLLM V1, vllm/v1/core/sched/scheduler.py; the default): decode-first, every running
request gets its tokens (1 + draft tokens) within the token budget, preempting the newest running
request by recompute when blocks run out; then waiting requests are admitted with the leftover
budget, their prompts chunked to fit, until a request cannot get blocks (waiting requests never
preempt anyone) or ``max_num_seqs`` are running.

Not mixed (SGLang without --enable-mixed-chunk, managers/scheduler.py get_next_batch_to_run):
prefill-first, a step runs either a prefill batch (unfinished prompt chunks first, then waiting
requests, within the chunk budget) or, when there is no prefill to run, the decode batch of
every running request. Running decodes wait out every prefill step.

The waiting queue is taken in arrival order (``fcfs``) or, with ``lpm``, longest cached prefix
first while at most ``LPM_MAX_QUEUE`` requests wait (SGLang's schedule_policy.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.sequence import Sequence, Status

LPM_MAX_QUEUE = 128  # schedule_policy.py: beyond this, lpm's prefix matching is skipped (fcfs)


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, num_lookahead_tokens: int = 0, mixed: bool = True,
                 policy: str = "fcfs"):
        if policy not in ("fcfs", "lpm"):
            raise ValueError(f"schedule policy {policy!r}: allowed fcfs, lpm")
        self.mixed = mixed
        self.policy = policy
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Admitted requests whose hit is being copied in from a tier below the GPU, with when it
        # lands: not running (vLLM holds them as WAITING_FOR_REMOTE_KVS, GPU blocks allocated).
        self.loading: list[tuple[Sequence, float]] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free_seq(seq)
        seq.status = Status.WAITING
        seq.num_computed_tokens = 0
        seq.num_spec_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def preempt_all(self) -> list[Sequence]:
        """Send every running request back to waiting (newest first, so the oldest stays at the
        head of the queue); they recompute from scratch when admitted again."""
        victims = []
        while self.running:
            victim = self.running.pop()
            self._preempt(victim)
            victims.append(victim)
        return victims

    def schedule(self, now: float = 0.0) -> ScheduledBatch:
        """The batch of the step that starts at ``now``."""
        self.block_manager.now = now
        self._land_loads(now)
        batch = self._schedule()
        self._hold_loads(batch)
        return batch

    def _schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        if not self.mixed:
            # A prefill batch runs alone: unfinished prompts first, then new requests.
            budget = self._schedule_running(batch, budget, prefill_only=True)
            if not batch.preempted:
                self._admit_waiting(batch, budget)
            if batch.seqs or batch.preempted:
                return batch
            # The decode batch is every running request: the chunk size bounds prefills only.
            budget += self.max_num_seqs * (1 + self.num_lookahead_tokens)
        budget = self._schedule_running(batch, budget)
        # vLLM admits nobody in a step that had to preempt.
        if self.mixed and not batch.preempted:
            self._admit_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int,
                          prefill_only: bool = False) -> int:
        """Tokens for running requests (only those still in their prompt when ``prefill_only``);
        returns the budget left."""
        bm = self.block_manager
        lookahead = self.num_lookahead_tokens
        limit = self.max_model_len - 1  # vLLM leaves room for the sampled token
        running = self.running
        bs = bm.block_size
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            # Decoding: one uncomputed token (the last sampled); a prompt or recompute has more.
            if prefill_only and seq.num_tokens - seq.num_computed_tokens <= 1:
                i += 1
                continue
            n = seq.num_tokens_with_spec - seq.num_computed_tokens
            n = min(n, budget, limit - seq.num_computed_tokens)
            if n <= 0:
                i += 1
                continue
            if seq.num_computed_tokens + n + lookahead > len(seq.block_table) * bs:  # needs a block
                scheduled = True
                while not bm.allocate(seq, n, (), lookahead):
                    victim = running.pop()
                    self._preempt(victim)
                    batch.preempted.append(victim)
                    if victim is seq:
                        scheduled = False
                        break
                if not scheduled:
                    break
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            i += 1
        return budget

    def _order_waiting(self) -> None:
        """lpm: longest cached prefix first (a stable sort, so ties keep arrival order)."""
        waiting = self.waiting
        if self.policy != "lpm" or not 1 < len(waiting) <= LPM_MAX_QUEUE:
            return
        match = self.block_manager.match_prefix
        self.waiting = deque(sorted(waiting, key=lambda seq: -match(seq)[1]))

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        bm = self.block_manager
        lookahead = self.num_lookahead_tokens
        running = self.running
        self._order_waiting()
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            cached, hit_tokens = bm.match_prefix(seq)
            n = min(seq.num_tokens - hit_tokens, budget)
            if not bm.allocate(seq, n, cached, lookahead, hit_tokens):
                break
            waiting.popleft()
            if bm.enable_caching:
                bm.record_query(seq.num_tokens, hit_tokens)
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = hit_tokens
            seq.num_computed_tokens = hit_tokens
            seq.status = Status.RUNNING
            running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n

    def _hold_loads(self, batch: ScheduledBatch) -> None:
        """Take requests whose admission starts a load from a lower tier out of this step: they
        compute once the load has landed (their token budget this step goes unused)."""
        loads = self.block_manager.take_loads()
        if not loads:
            return
        keep = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens)
                if s.request_id not in loads]
        batch.seqs = [s for s, _ in keep]
        batch.num_new_tokens = [n for _, n in keep]
        running = self.running
        for seq in [s for s in running if s.request_id in loads]:
            running.remove(seq)
            self.loading.append((seq, loads[seq.request_id]))

    def _land_loads(self, now: float) -> None:
        if not self.loading:
            return
        landed = [x for x in self.loading if x[1] <= now]
        if landed:
            self.loading = [x for x in self.loading if x[1] > now]
            self.running.extend(seq for seq, _ in landed)

    def next_load_s(self) -> float | None:
        """When the first load in flight lands (None: none is)."""
        return min(done for _, done in self.loading) if self.loading else None

    def remove(self, seq: Sequence) -> bool:
        """Take a sequence out of any queue (finish or abort), freeing its blocks."""
        loading = [x for x in self.loading if x[0] is seq]
        if loading:
            self.loading.remove(loading[0])
            self.block_manager.free_seq(seq)
            return True
        if seq.status is Status.RUNNING:
            try:
                self.running.remove(seq)
            except ValueError:
                return False
            self.block_manager.free_seq(seq)
            return True
        try:
            self.waiting.remove(seq)
        except ValueError:
            return False
        return True
