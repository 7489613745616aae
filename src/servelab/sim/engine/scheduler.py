"""vLLM V1's scheduling policy, one step at a time (vllm/v1/core/sched/scheduler.py).

Decode-first: every running request gets its tokens (1 + draft tokens) within the token budget,
preempting the newest running request by recompute when blocks run out; then waiting requests
are admitted FCFS with the leftover budget, their prompts chunked to fit, until a request cannot
get blocks (waiting requests never preempt anyone) or ``max_num_seqs`` are running.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.sequence import Sequence, Status


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
                 max_model_len: int, num_lookahead_tokens: int = 0):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

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

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        lookahead = self.num_lookahead_tokens
        limit = self.max_model_len - 1  # vLLM leaves room for the sampled token
        running = self.running
        bs = bm.block_size

        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
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

        # vLLM admits nobody in a step that had to preempt.
        if batch.preempted:
            return batch
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            cached = bm.lookup_prefix(seq)
            hit_tokens = len(cached) * bm.block_size
            n = min(seq.num_tokens - hit_tokens, budget)
            if not bm.allocate(seq, n, cached, lookahead):
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
        return batch

    def remove(self, seq: Sequence) -> bool:
        """Take a sequence out of either queue (finish or abort), freeing its blocks."""
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
