"""Prefix matching finer than the allocation block (SGLang's page_size 1 on 16-token blocks): hits
count exactly the shared tokens, as a pool of one-token blocks would, while memory moves in
16-token blocks."""
from __future__ import annotations

import random
from dataclasses import replace

from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.engine import Engine
from servelab.sim.engine.sequence import Sequence
from servelab.specs.engine_config import build_kind_engine_config
from servelab.specs.server_kinds import SGLANG


def seq(rid, ids, max_tokens=4):
    return Sequence(rid, ids, max_tokens, ignore_eos=True)


def admit(bm, s):
    """Admit, compute the whole prompt and commit it, as the engine does once a prefill ends."""
    cached, hit = bm.match_prefix(s)
    assert bm.allocate(s, s.num_tokens - hit, cached, 0, hit)
    s.num_computed_tokens = s.num_tokens
    bm.commit(s)
    return hit


def test_a_hit_counts_the_shared_tokens_inside_a_block():
    bm = BlockManager(20, 16, match_size=1)
    a = seq("a", list(range(40)))
    admit(bm, a)
    assert admit(bm, seq("b", list(range(37)) + [900, 901])) == 37   # 2 blocks + 5 of the third
    assert admit(bm, seq("c", list(range(20)))) == 19                # one token left to compute
    assert admit(bm, seq("d", [7] + list(range(1, 40)))) == 0        # differs at the first token
    # Blocks are still 16 tokens: a's 40 tokens took 3, b's partial third block is its own copy.
    assert len(a.block_table) == 3 and bm.num_used_blocks == 3 + 1 + 1 + 3


def test_a_coarser_match_unit_rounds_the_hit_down():
    bm = BlockManager(20, 16, match_size=4)
    admit(bm, seq("a", list(range(40))))
    assert admit(bm, seq("b", list(range(37)) + [900])) == 36


def test_output_tokens_match_only_their_own_request():
    bm = BlockManager(20, 16, match_size=1)
    a = seq("a", list(range(20)), max_tokens=10)
    admit(bm, a)
    a.num_output_tokens = 6                     # decoded 6: computed 25 of 26 tokens
    a.num_computed_tokens = 25
    bm.free_seq(a)                              # preempted: the run so far is registered
    other = seq("b", list(range(20)) + [5, 5, 5, 5, 5])
    assert admit(bm, other) == 20               # the prompt part only
    a.num_computed_tokens = 0
    cached, hit = bm.match_prefix(a)
    assert hit == 25                            # a recomputing finds its own output again


def test_evicting_a_block_forgets_its_partial_run():
    bm = BlockManager(4, 16, match_size=1)
    a = seq("a", list(range(20)))
    admit(bm, a)
    bm.free_seq(a)
    hog = seq("hog", list(range(500, 564)))
    assert bm.allocate(hog, 64)                 # takes every block, a's included
    bm.free_seq(hog)
    assert bm.match_prefix(seq("b", list(range(20)) + [1]))[1] == 0


def test_reset_forgets_partial_runs():
    bm = BlockManager(10, 16, match_size=1)
    a = seq("a", list(range(20)))
    admit(bm, a)
    bm.free_seq(a)
    assert bm.reset_prefix_cache()
    assert bm.match_prefix(seq("b", list(range(20)) + [1]))[1] == 0


def _sglang_engine(**knobs) -> Engine:
    config = build_kind_engine_config("L40S", "Qwen/Qwen2.5-7B-Instruct",
                                      ["--context-length", "4096"], SGLANG)
    return Engine(replace(config, **knobs))


def test_a_running_request_shares_its_prompt_as_soon_as_its_prefill_ends():
    engine = _sglang_engine()
    for n in (100, 10):                           # 4 tokens into a block; within the first
        prompt = list(range(n * 1000, n * 1000 + n))
        a = engine.add_request(f"a{n}", prompt, 200, ignore_eos=True)
        now = 0.0
        while a.num_output_tokens < 2:            # a's last block is far from full
            now += engine.step(now).duration_s
        b = engine.add_request(f"b{n}", prompt + [5], 4, ignore_eos=True)
        now += engine.step(now).duration_s
        assert b.num_cached_tokens == n
        engine.abort_request(a.request_id)


def _workload(engine: Engine, seed: int) -> list[tuple]:
    """Requests that share prefixes of arbitrary lengths (not block multiples) and extend earlier
    prompts, arriving over time; returns each request's hit, first-token and finish times."""
    rng = random.Random(seed)
    families = [[rng.randrange(1000, 9000) for _ in range(rng.randrange(3, 90))] for _ in range(4)]
    prompts: list[list[int]] = []
    arrivals = sorted(rng.uniform(0, 4) for _ in range(40))
    seqs, now, i = [], 0.0, 0
    while i < len(arrivals) or engine.has_unfinished():
        while i < len(arrivals) and arrivals[i] <= now:
            if prompts and rng.random() < 0.3:
                prompt = rng.choice(prompts) + [rng.randrange(9000, 9999) for _ in range(7)]
            else:
                family = rng.choice(families)
                prompt = family[:rng.randrange(1, len(family) + 1)] + [
                    rng.randrange(9000, 9999) for _ in range(rng.randrange(1, 60))]
            prompts.append(prompt)
            seqs.append(engine.add_request(f"r{i}", prompt, rng.randrange(1, 40),
                                           ignore_eos=True, arrival_time=now))
            i += 1
        if engine.has_unfinished():
            now += engine.step(now).duration_s
        else:
            now = arrivals[i]
    return [(s.num_cached_tokens, s.first_token_time, s.finish_time) for s in seqs]


def test_sixteen_token_blocks_answer_as_one_token_blocks_do():
    paged, per_token = _sglang_engine(), _sglang_engine(kv_page_tokens=None)
    assert (paged.block_manager.block_size, per_token.block_manager.block_size) == (16, 1)
    assert paged.block_manager.num_blocks == paged.kv_plan.kv_tokens // 16
    for seed in (1, 2):
        got, want = _workload(paged, seed), _workload(per_token, seed)
        assert got == want
        assert sum(1 for hit, _, _ in want if hit % 16) > 5  # partial-block hits were exercised
