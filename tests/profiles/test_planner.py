"""The request sequence: deterministic, identical when split over workers, right arrivals."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from servelab.profiles import load_profile
from servelab.profiles.planner import BLOCK, RequestPlanner, arrival_offsets

MIXED = """
name: m
description: mixed classes with prefixes and sessions
seed: 5
classes:
  - name: single
    weight: 3
    prompt_tokens: {kind: uniform, min: 10, max: 1000}
    output_tokens: {kind: lognormal, median: 50, sigma: 0.5, max: 400}
    prefix_tokens: 100
    prefix_groups: 4
  - name: talk
    weight: 1
    prompt_tokens: {kind: normal, mean: 80, stdev: 20}
    output_tokens: 32
    session: {turns: {kind: uniform, min: 2, max: 5}, think_time: {kind: uniform, min: 1, max: 2}}
load:
  {plan}
"""


def planner(write_profile, plan="concurrency: {levels: [1], hold: 10}", seed=None):
    return RequestPlanner(load_profile(write_profile(MIXED.replace("{plan}", plan))), seed)


def key(r):
    return (r.index, r.class_name, r.prompt_tokens, r.output_tokens, r.prefix_group,
            r.session_id, r.turn, r.think_time_s, r.arrival_s)


def test_same_seed_same_sequence_other_seed_differs(write_profile):
    a = [key(r) for r in itertools.islice(planner(write_profile).requests(), 3000)]
    b = [key(r) for r in itertools.islice(planner(write_profile).requests(), 3000)]
    c = [key(r) for r in itertools.islice(planner(write_profile, seed=6).requests(), 3000)]
    assert a == b
    assert a != c
    assert [r[0] for r in a] == list(range(3000))   # indices run on without gaps


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_split_over_workers_gives_the_same_union(write_profile, workers):
    whole = {r.index: key(r) for r in itertools.islice(planner(write_profile).requests(), 6000)}
    parts = []
    for w in range(workers):
        p = planner(write_profile)   # a fresh planner per worker, as in separate processes
        mine = list(itertools.islice(p.sessions(w, workers), 4000 // workers))
        parts.append(mine)
        # A session stays whole with its worker; items are dealt round robin.
        assert all(s[0].turn == 1 and [r.turn for r in s] == list(range(1, len(s) + 1))
                   for s in mine)
    union = [key(r) for part in parts for s in part for r in s]
    assert len(union) == len({u[0] for u in union})
    covered = [u for u in union if u[0] in whole]
    assert len(covered) > 3000 and all(whole[u[0]] == u for u in covered)
    # The first items of all workers together are exactly the first items of the whole sequence.
    firsts = sorted(s[0].index for part in parts for s in part[:50])
    expected_items = [s[0].index for s in itertools.islice(planner(write_profile).sessions(),
                                                            50 * workers)]
    assert firsts == expected_items


def test_single_turn_profile_request_i_goes_to_worker_i_mod_n(write_profile):
    text = MIXED.replace("{plan}", "concurrency: {levels: [1], hold: 10}")
    text = text[:text.index("  - name: talk")] + text[text.index("load:"):]
    prof = load_profile(write_profile(text))
    for w in range(3):
        reqs = list(itertools.islice(RequestPlanner(prof).requests(w, 3), 500))
        assert [r.index for r in reqs] == list(range(w, 1500, 3))


def test_class_mix_prefix_groups_and_sessions(write_profile):
    reqs = list(itertools.islice(planner(write_profile).requests(), 40000))
    firsts = [r for r in reqs if r.turn == 1]
    share = np.mean([r.class_name == "single" for r in firsts])
    assert abs(share - 0.75) < 0.015           # weights 3 : 1 over items
    singles = [r for r in reqs if r.class_name == "single"]
    assert {r.prefix_group for r in singles} == {0, 1, 2, 3}
    assert all(r.prefix_tokens == 100 and 110 <= r.prompt_tokens <= 1100 for r in singles)
    assert all(r.session_id is None and r.turns == 1 for r in singles)
    talks = [r for r in reqs if r.class_name == "talk"]
    by_session: dict = {}
    for r in talks:
        by_session.setdefault(r.session_id, []).append(r)
    for sid, turns in list(by_session.items())[:-1]:
        assert [r.turn for r in turns] == list(range(1, turns[0].turns + 1))
        assert [r.index for r in turns] == list(range(turns[0].index, turns[0].index + len(turns)))
        assert turns[0].think_time_s == 0 and all(1 <= r.think_time_s < 2 for r in turns[1:])
        assert 2 <= len(turns) <= 5 and turns[0].prefix_group is None
    mean_turns = np.mean([len(t) for t in list(by_session.values())[:-1]])
    assert abs(mean_turns - 3.5) < 0.1


def test_block_boundaries_do_not_shift_indices(write_profile):
    p = planner(write_profile)
    items = [p.item(k) for k in range(3 * BLOCK)]
    flat = [r.index for item in items for r in item]
    assert flat == list(range(len(flat)))
    # A planner asked for a late item first computes the same item.
    assert planner(write_profile).item(2 * BLOCK + 7) == items[2 * BLOCK + 7]


def test_stage_plans(write_profile):
    conc = planner(write_profile, "concurrency: {levels: [1, 8], warmup: 5s, hold: 1m}").stages()
    assert [(s.kind, s.users, s.warmup_s, s.hold_s, s.duration_s) for s in conc] == \
        [("concurrency", 1, 5, 60, 65), ("concurrency", 8, 5, 60, 65)]
    rate = planner(write_profile, "rate: {rates: [2, 4], duration: 30, warmup: 10, "
                   "max_in_flight: 9, arrival: gamma, burstiness: 0.5}").stages()
    assert [(s.rate, s.duration_s, s.expected_requests, s.max_in_flight, s.arrival, s.burstiness)
            for s in rate] == [(2, 40, 80, 9, "gamma", 0.5), (4, 40, 160, 9, "gamma", 0.5)]
    ramp = planner(write_profile, "ramp: {stages: [{users: 10, spawn_rate: 2, duration: 30}, "
                   "{users: 0, spawn_rate: 5, duration: 10s}]}").stages()
    assert [(s.kind, s.users, s.spawn_rate, s.duration_s) for s in ramp] == \
        [("ramp", 10, 2, 30), ("ramp", 0, 5, 10)]
    with pytest.raises(ValueError, match="closed loop"):
        planner(write_profile).arrivals(0)


def test_rate_arrivals_sharded_and_indexed_across_stages(write_profile):
    p = planner(write_profile, "rate: {rates: [5, 20], duration: 20}")
    stage0, stage1 = p.arrivals(0), p.arrivals(1)
    firsts0 = [r for r in stage0 if r.turn == 1]
    assert all(r.arrival_s is None for r in stage0 if r.turn > 1)
    assert all(0 <= r.arrival_s < 20 for r in firsts0)
    assert [r.arrival_s for r in firsts0] == sorted(r.arrival_s for r in firsts0)
    assert len(firsts0) == len(p.arrival_times(0))
    # Stage 1 continues the index sequence where stage 0 stopped.
    assert stage1[0].index == stage0[-1].index + 1
    assert p.stage_first_item(1) == len(p.arrival_times(0))
    for stage, whole in ((0, stage0), (1, stage1)):
        parts = [planner(write_profile, "rate: {rates: [5, 20], duration: 20}").arrivals(
            stage, w, 3) for w in range(3)]
        merged = sorted((r for part in parts for r in part), key=lambda r: r.index)
        assert [key(r) for r in merged] == [key(r) for r in whole]


def test_arrival_processes_statistics():
    rng = np.random.default_rng(1)
    poisson = arrival_offsets(rng, 10.0, 1000.0, "poisson")
    gaps = np.diff(poisson)
    assert abs(len(poisson) - 10_000) < 400                 # Poisson(10,000): sd 100
    assert abs(gaps.mean() - 0.1) < 0.003 and abs(gaps.std() / gaps.mean() - 1) < 0.03
    bursty = arrival_offsets(rng, 10.0, 1000.0, "gamma", burstiness=0.25)
    gaps = np.diff(bursty)
    assert abs(gaps.mean() - 0.1) < 0.006
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.15       # CV = 1/sqrt(b) = 2
    smooth = np.diff(arrival_offsets(rng, 10.0, 1000.0, "gamma", burstiness=4))
    assert abs(smooth.std() / smooth.mean() - 0.5) < 0.03
    constant = arrival_offsets(rng, 4.0, 10.0, "constant")
    assert np.allclose(constant, np.arange(40) / 4)


def test_trace_plan_uses_rows(write_profile, tmp_path):
    (tmp_path / "t.jsonl").write_text(
        "\n".join(f'{{"timestamp": {1000 + 500 * i}, "input_length": {100 + i}, '
                  f'"output_length": {10 + i}, "hash_ids": [1, 2]}}' for i in range(10)))
    text = """
        name: tr
        description: trace
        classes:
          - {name: a, weight: 1}
          - {name: b, weight: 1}
        load:
          trace: {file: t.jsonl, time_scale: 2, limits: {max_requests: 8}}
        """
    p = RequestPlanner(load_profile(write_profile(text)))
    reqs = p.arrivals(0)
    assert [r.prompt_tokens for r in reqs] == [100 + i for i in range(8)]
    assert [r.output_tokens for r in reqs] == [10 + i for i in range(8)]
    assert [r.arrival_s for r in reqs] == [i * 1.0 for i in range(8)]   # 0.5 s apart, x2
    assert {r.class_name for r in reqs} == {"a", "b"}
    assert [r.index for r in p.requests()] == list(range(8))           # finite under a trace
    stage = p.stages()[0]
    assert stage.kind == "trace" and stage.expected_requests == 8 and stage.duration_s == 7
