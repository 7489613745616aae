"""BlockManager: hashing full blocks, sharing, reference counts, LRU eviction, counters."""
from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.sequence import Sequence


def seq(rid, ids, max_tokens=4):
    return Sequence(rid, ids, max_tokens, ignore_eos=True)


def admit(bm, s):
    cached = bm.lookup_prefix(s)
    hit = len(cached) * bm.block_size
    assert bm.allocate(s, s.num_tokens - hit, cached)
    bm.record_query(s.num_tokens, hit)
    s.num_computed_tokens = s.num_tokens
    bm.commit(s)
    return hit


def test_allocation_rounds_up_to_blocks_and_counts_usage():
    bm = BlockManager(10, 16)
    s = seq("a", list(range(33)))
    assert bm.allocate(s, 33)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7
    assert abs(bm.usage - 0.3) < 1e-12
    s.num_computed_tokens = 33
    assert bm.allocate(s, 15)  # fills the third block: no new block
    assert len(s.block_table) == 3
    s.num_computed_tokens = 48
    assert bm.allocate(s, 1, num_lookahead=16)  # lookahead slots need blocks too
    assert len(s.block_table) == 5


def test_allocation_failure_changes_nothing():
    bm = BlockManager(4, 16)
    a = seq("a", list(range(40)))
    assert bm.allocate(a, 40)
    b = seq("b", list(range(100, 140)))
    assert not bm.allocate(b, 40)
    assert b.block_table == [] and bm.num_free_blocks == 1


def test_only_full_blocks_are_shared_and_hit_counts_are_tokens():
    bm = BlockManager(20, 16)
    prefix = list(range(1000, 1040))  # 2 full blocks + 8 tokens
    a = seq("a", prefix + [1, 2, 3])
    assert admit(bm, a) == 0
    b = seq("b", prefix + [7, 8, 9])
    assert bm.lookup_prefix(b) == a.block_table[:2]
    assert admit(bm, b) == 32
    assert bm.ref_count[a.block_table[0]] == 2 and bm.ref_count[a.block_table[2]] == 1
    assert (bm.query_tokens, bm.hit_tokens) == (86, 32)
    # Same tokens in another order hash differently (the chain includes the parent hash).
    c = seq("c", prefix[16:32] + prefix[:16] + [5])
    assert bm.lookup_prefix(c) == []


def test_a_hit_always_leaves_one_token_to_compute():
    bm = BlockManager(10, 16)
    a = seq("a", list(range(32)))
    admit(bm, a)
    twin = seq("twin", list(range(32)))
    assert len(bm.lookup_prefix(twin)) == 1  # 31 tokens may hit -> one full block


def test_freed_blocks_stay_cached_until_evicted_lru_first():
    bm = BlockManager(4, 16)
    a = seq("a", list(range(32)))
    admit(bm, a)
    a_blocks = list(a.block_table)
    bm.free_seq(a)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0
    # Still cached: a new request with the same first block gets it back.
    again = seq("again", list(range(16)) + [99] * 10)
    assert bm.lookup_prefix(again) == a_blocks[:1]
    # Fresh allocations take never-used blocks first, then the LRU cached ones;
    # a's last block was queued before its first, so it goes first.
    b = seq("b", list(range(500, 532)))
    assert bm.allocate(b, 32)
    assert bm.lookup_prefix(again) == a_blocks[:1]
    c = seq("c", list(range(900, 916)))
    assert bm.allocate(c, 16)
    assert c.block_table == [a_blocks[1]]
    assert bm.lookup_prefix(again) == a_blocks[:1]
    d = seq("d", list(range(700, 716)))
    assert bm.allocate(d, 16)
    assert bm.lookup_prefix(again) == []  # evicted


def test_touching_a_cached_free_block_takes_it_out_of_the_free_queue():
    bm = BlockManager(3, 16)
    a = seq("a", list(range(16)) + [1])
    admit(bm, a)
    bm.free_seq(a)
    b = seq("b", list(range(16)) + [2, 3])
    cached = bm.lookup_prefix(b)
    assert len(cached) == 1
    assert bm.allocate(b, 2, cached)
    assert bm.ref_count[cached[0]] == 1 and cached[0] not in bm.free
    assert bm.num_free_blocks == 1
    # Three blocks needed, one free: refused even though the cached block was "free" before.
    e = seq("e", list(range(300, 348)))
    assert not bm.allocate(e, 48)


def test_output_blocks_are_private_but_hit_on_recompute():
    bm = BlockManager(20, 16)
    a = seq("a", list(range(20)), max_tokens=30)
    admit(bm, a)
    a.num_output_tokens = 20            # 40 tokens, 39 computed: blocks 0 and 1 are full
    bm.allocate(a, 19)
    a.num_computed_tokens = 39
    bm.commit(a)
    twin = seq("twin", list(range(20)), max_tokens=30)
    twin.num_output_tokens = 20
    assert len(bm.lookup_prefix(twin)) == 1  # shares the prompt block, not a's output block
    bm.free_seq(a)
    a.num_computed_tokens = 0
    assert len(bm.lookup_prefix(a)) == 2     # a preempted request finds its own blocks again


def test_caching_off_never_hits():
    bm = BlockManager(10, 16, enable_caching=False)
    a = seq("a", list(range(40)))
    admit(bm, a)
    assert bm.lookup_prefix(seq("b", list(range(40)))) == []


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use():
    bm = BlockManager(10, 16)
    a = seq("a", list(range(40)))
    admit(bm, a)
    assert not bm.reset_prefix_cache()  # vLLM: "some blocks (3) are not freed yet"
    assert bm.num_used_blocks == 3 and len(bm.hash_to_block) == 2  # nothing changed
    bm.free_seq(a)
    assert bm.num_used_blocks == 0 and bm.lookup_prefix(seq("b", list(range(40))))
    assert bm.reset_prefix_cache()
    b = seq("b", list(range(40)))
    assert bm.lookup_prefix(b) == [] and admit(bm, b) == 0
    assert all(h is None for i, h in enumerate(bm.block_hash) if i not in b.block_table[:2])
