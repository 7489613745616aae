"""Paged KV blocks with prefix caching (vLLM V1's KVCacheManager, nano-vllm's BlockManager).

Only full blocks are cached, keyed on hash(parent hash, block tokens). A block whose last
reference goes away stays in the cache until it is reused: free blocks form one LRU queue (an
ordered dict: head = evicted first), and a cached free block that gets a hit leaves the queue.
"""
from __future__ import annotations

from collections import OrderedDict

from servelab.sim.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks if self.num_blocks else 0.0

    def _hash_upto(self, seq: Sequence, num_blocks: int) -> list[int]:
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else 0
            hashes.append(hash((parent, seq.block_key(i, bs))))
        return hashes

    def lookup_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold this sequence's leading full blocks. At least one token is left
        to compute (vLLM caps a hit at num_tokens - 1) so the step has something to sample from."""
        if not self.enable_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return []
        hits: list[int] = []
        hash_to_block = self.hash_to_block
        hashes = seq.block_hashes
        bs = self.block_size
        for i in range(max_blocks):
            if i < len(hashes):
                h = hashes[i]
            else:
                h = hash((hashes[-1] if hashes else 0, seq.block_key(i, bs)))
                hashes.append(h)
            block = hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_query(self, num_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += num_tokens
        self.hit_tokens += hit_tokens

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, num_cached_blocks: int = 0,
                      num_lookahead: int = 0) -> int:
        total = seq.num_computed_tokens + num_cached_blocks * self.block_size + num_new_tokens + num_lookahead
        need = -(-total // self.block_size) - len(seq.block_table) - num_cached_blocks
        return max(0, need)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] | tuple = (),
                 num_lookahead: int = 0) -> bool:
        """Give ``seq`` room for ``num_new_tokens`` more (+ lookahead). False, changing nothing,
        when the free queue cannot supply the blocks."""
        need = self.blocks_needed(seq, num_new_tokens, len(cached_blocks), num_lookahead)
        ref = self.ref_count
        # Touching a cached block with no references takes it out of the free queue.
        taken_from_free = sum(1 for b in cached_blocks if ref[b] == 0)
        if need > len(self.free) - taken_from_free:
            return False
        table = seq.block_table
        free = self.free
        for b in cached_blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1
            table.append(b)
        for _ in range(need):
            b, _ = free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:  # evict the least recently used cached block
                if self.hash_to_block.get(h) == b:
                    del self.hash_to_block[h]
                self.block_hash[b] = None
            ref[b] = 1
            table.append(b)
        return True

    def commit(self, seq: Sequence) -> None:
        """Register blocks that became full (all their tokens computed) in the prefix cache."""
        if not self.enable_caching:
            return
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        done = seq.num_committed_blocks
        if full <= done:
            return
        hashes = self._hash_upto(seq, full)
        table = seq.block_table
        for i in range(done, full):
            b = table[i]
            if self.block_hash[b] is None:
                h = hashes[i]
                if h not in self.hash_to_block:
                    self.hash_to_block[h] = b
                    self.block_hash[b] = h
        seq.num_committed_blocks = full

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's BlockPool.reset_prefix_cache does: refused
        (False, nothing changed) while any block is in use, since a running request's blocks are
        both cached and its own KV; once everything is free, no later request can hit."""
        if len(self.free) != self.num_blocks:
            return False
        self.hash_to_block.clear()
        self.block_hash = [None] * self.num_blocks
        return True

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def free_seq(self, seq: Sequence) -> None:
        """Drop the sequence's references. Its last blocks go to the free queue first, so they are
        evicted before its prefix (which other requests are likelier to share)."""
        ref = self.ref_count
        free = self.free
        for b in reversed(seq.block_table):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
        seq.block_table = []
        seq.num_committed_blocks = 0

