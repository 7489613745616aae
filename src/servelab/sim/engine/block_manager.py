"""Paged KV blocks with prefix caching (vLLM V1's KVCacheManager, nano-vllm's BlockManager).

Only full blocks are cached, keyed on hash(parent hash, block tokens). A block whose last
reference goes away stays in the cache until it is reused: free blocks form one LRU queue (an
ordered dict: head = evicted first), and a cached free block that gets a hit leaves the queue.

Finer prefix matching (SGLang's radix cache at page_size 1): ``match_size`` below the block size
makes a hit count in units of ``match_size`` tokens while memory is still allocated, cached and
evicted in whole blocks, so a step costs what it costs with 16-token blocks instead of tracking
one block per token. Leading full blocks hit by hash as above; at the first block that misses,
the cached blocks holding the same parent chain and the same first token are compared token by
token (a block's tokens count once they are committed, full or not: a request's tail block is
matchable too), and the longest common run is the partial hit. The hit request does not share
that partial block: it gets a block of its own with the matched tokens counted as computed (a
copy). Approximations against a token-granular pool, each under one block per request: the
copied tokens are held twice while both blocks live, a request's last block is rounded up to a
whole block, and the pool holds ``kv_tokens // block_size`` blocks (the last partial block's
worth, under 16 tokens, unused). Eviction frees a whole block of tokens at once, LRU by block.
"""
from __future__ import annotations

from collections import OrderedDict

from servelab.sim.engine.sequence import Sequence


class BlockManager:
    # The engine's clock (set as each step is scheduled and as it ends): a tier below the GPU
    # (``kv_offload``) stamps its lookups, loads and stores with it; this cache needs no clock.
    now: float = 0.0

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True,
                 match_size: int | None = None):
        match_size = match_size or block_size
        if match_size > block_size or block_size % match_size:
            raise ValueError(f"match size {match_size} must divide the block size {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.match_size = match_size
        self.partial = match_size < block_size
        self.enable_caching = enable_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.query_tokens = 0
        self.hit_tokens = 0
        # Partial matching only: blocks by (parent hash, first token key), and per block what it
        # holds: (prompt tokens in it, owner request id) and how many of its tokens are committed.
        self.children: dict[tuple, dict[int, None]] = {}
        self.child_key: list[tuple | None] = [None] * num_blocks
        self.content: list[tuple | None] = [None] * num_blocks
        self.fill = [0] * num_blocks

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

    def match_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        """The shared cached blocks to take and how many tokens the hit covers: whole blocks
        only, unless ``match_size`` is finer (then a partial run into the next block counts)."""
        blocks = self.lookup_prefix(seq)
        hit = len(blocks) * self.block_size
        if self.partial and self.enable_caching:
            hit += self._partial_hit(seq, len(blocks))
        return blocks, hit

    def _partial_hit(self, seq: Sequence, index: int) -> int:
        """Tokens of block ``index`` (after ``index`` full-block hits) that a cached block with
        the same parent chain also holds, in whole match units, leaving one token to compute."""
        bs = self.block_size
        start = index * bs
        room = min(bs - 1, seq.num_tokens - 1 - start)
        if room < self.match_size:
            return 0
        parent = seq.block_hashes[index - 1] if index else 0
        candidates = self.children.get((parent, _first_key(seq, start)))
        if not candidates:
            return 0
        mine = seq.prompt_token_ids[start:min(start + bs, seq.num_prompt_tokens)]
        held = ((self.content[b], self.fill[b]) for b in candidates)
        best = _longest_common_run(held, mine, seq.request_id, room)
        return min(best, room) // self.match_size * self.match_size

    def record_query(self, num_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += num_tokens
        self.hit_tokens += hit_tokens

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, num_cached_blocks: int = 0,
                      num_lookahead: int = 0, num_cached_tokens: int | None = None) -> int:
        if num_cached_tokens is None:
            num_cached_tokens = num_cached_blocks * self.block_size
        total = seq.num_computed_tokens + num_cached_tokens + num_new_tokens + num_lookahead
        need = -(-total // self.block_size) - len(seq.block_table) - num_cached_blocks
        return max(0, need)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] | tuple = (),
                 num_lookahead: int = 0, num_cached_tokens: int | None = None) -> bool:
        """Give ``seq`` room for ``num_new_tokens`` more (+ lookahead) after a hit on
        ``cached_blocks`` that covers ``num_cached_tokens`` (its whole blocks when None). False,
        changing nothing, when the free queue cannot supply the blocks."""
        need = self.blocks_needed(seq, num_new_tokens, len(cached_blocks), num_lookahead,
                                  num_cached_tokens)
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
        partial = self.partial
        for _ in range(need):
            b, _ = free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:  # evict the least recently used cached block
                if self.hash_to_block.get(h) == b:
                    del self.hash_to_block[h]
                self.block_hash[b] = None
            if partial and self.child_key[b] is not None:
                self._forget_child(b)
            ref[b] = 1
            table.append(b)
        return True

    def _forget_child(self, b: int) -> None:
        key = self.child_key[b]
        siblings = self.children[key]
        del siblings[b]
        if not siblings:
            del self.children[key]
        self.child_key[b] = None
        self.content[b] = None
        self.fill[b] = 0

    def commit(self, seq: Sequence) -> None:
        """Register blocks that became full (all their tokens computed) in the prefix cache; with
        partial matching, also the committed run of the last block."""
        if not self.enable_caching:
            return
        committed = min(seq.num_computed_tokens, seq.num_tokens)
        full = committed // self.block_size
        done = seq.num_committed_blocks
        if full > done:
            hashes = self._hash_upto(seq, full)
            table = seq.block_table
            partial = self.partial
            # A full block of output tokens needs no partial matching: only its own request
            # shares it, and that request reaches it by hash.
            prompt_blocks = -(-seq.num_prompt_tokens // self.block_size)
            for i in range(done, full):
                b = table[i]
                if self.block_hash[b] is None:
                    h = hashes[i]
                    if h not in self.hash_to_block:
                        self.hash_to_block[h] = b
                        self.block_hash[b] = h
                        if partial and (i < prompt_blocks or self.child_key[b] is not None):
                            self._register_child(seq, i, self.block_size)
                    elif partial and self.child_key[b] is not None:
                        self._forget_child(b)  # a duplicate: the registered block matches instead
            seq.num_committed_blocks = full
        if self.partial:
            tail = committed - full * self.block_size
            if tail and full < len(seq.block_table):
                self._register_child(seq, full, tail)

    def _register_child(self, seq: Sequence, index: int, fill: int) -> None:
        b = seq.block_table[index]
        if self.child_key[b] is None:
            # Block ``index`` of its sequence: its parent's hash is known once the blocks before
            # it are full and hashed, which commit has just done.
            start = index * self.block_size
            parent = seq.block_hashes[index - 1] if index else 0
            key = (parent, _first_key(seq, start))
            siblings = self.children.get(key)
            if siblings is None:
                self.children[key] = {b: None}
            else:
                siblings[b] = None
            self.child_key[b] = key
            end = min(start + self.block_size, seq.num_prompt_tokens)
            self.content[b] = (tuple(seq.prompt_token_ids[start:end]), seq.request_id)
        self.fill[b] = fill

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's BlockPool.reset_prefix_cache does: refused
        (False, nothing changed) while any block is in use, since a running request's blocks are
        both cached and its own KV; once everything is free, no later request can hit."""
        if len(self.free) != self.num_blocks:
            return False
        self.hash_to_block.clear()
        self.block_hash = [None] * self.num_blocks
        self.children.clear()
        self.child_key = [None] * self.num_blocks
        self.content = [None] * self.num_blocks
        self.fill = [0] * self.num_blocks
        return True

    def take_loads(self) -> dict[str, float]:
        """Admissions since the last call whose hit a lower tier still copies in -> when it lands
        (none here: every hit is on the GPU)."""
        return {}

    def sync_stall_s(self, seqs, counts) -> float:
        """Seconds a step of ``counts`` new tokens of ``seqs`` waits on KV copies: none here
        (only LMCache's copies are synchronous; vLLM's native tier copies beside the steps)."""
        return 0.0

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def free_seq(self, seq: Sequence) -> None:
        """Drop the sequence's references. Its last blocks go to the free queue first, so they are
        evicted before its prefix (which other requests are likelier to share)."""
        if self.partial and self.enable_caching and seq.block_table \
                and seq.num_tokens - seq.num_computed_tokens <= 1:
            # Decoding (at most one token left to compute), every computed token was committed
            # when emitted; the engine registers a block only when it fills and once after the
            # prefill, so the last block's run as of now is registered here, before it is freed.
            self.commit(seq)
        ref = self.ref_count
        free = self.free
        for b in reversed(seq.block_table):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
        seq.block_table = []
        seq.num_committed_blocks = 0


def _longest_common_run(held, mine, request_id: str, room: int) -> int:
    """The longest run of ``mine`` (a block's prompt tokens) that one of the ``held`` blocks,
    each ((its prompt tokens, owner), committed tokens), starts with, up to ``room`` tokens."""
    best = 0
    for (prompt, owner), fill in held:
        run = min(fill, room)
        same = 0
        limit = min(len(prompt), len(mine), run)
        while same < limit and prompt[same] == mine[same]:
            same += 1
        # Past the prompt both hold output tokens, which only the same request shares.
        if same == len(prompt) == len(mine) and owner == request_id:
            same = run
        if same > best:
            best = same
            if best >= room:
                break
    return best


def _first_key(seq: Sequence, pos: int):
    """The token at ``pos`` as the cache compares it: an output token is private to its request."""
    return seq.prompt_token_ids[pos] if pos < seq.num_prompt_tokens else seq.request_id
