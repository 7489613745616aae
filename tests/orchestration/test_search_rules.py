"""The search's rules on synthetic probes: the interval, the levels, the order of the probes,
where it stops and what it answers (loadgen.search_rules), with no server."""
import math

import pytest

from servelab.loadgen.search_rules import (Bisection, Probe, level_grid, plain_bisection_probes,
                                           stage_index, start_position, wilson)


def test_wilson_interval_matches_the_textbook_values():
    lo, hi = wilson(95, 100)   # statsmodels' proportion_confint(95, 100, method="wilson")
    assert lo == pytest.approx(0.88825, abs=1e-4) and hi == pytest.approx(0.97846, abs=1e-4)
    lo, hi = wilson(30, 30)    # all met: the interval still says 30 requests are few
    assert hi == 1.0 and lo == pytest.approx(30 / (30 + 1.959964 ** 2), abs=1e-9)
    assert wilson(0, 10)[0] == 0.0 and wilson(3, 0) is None


def test_levels_are_one_resolution_step_apart():
    users = level_grid(1, 64, 0.1, integer=True)
    assert users[:10] == [float(n) for n in range(1, 11)] and users[-1] == 64.0
    assert all(b / a <= 1.1 + 1e-9 or b - a == 1 for a, b in zip(users, users[1:]))
    assert users[10:14] == [11.0, 12.0, 13.0, 14.0] and 15.0 in users
    rates = level_grid(0.5, 40, 0.25, integer=False)
    assert rates[0] == 0.5 and rates[-1] == 40.0
    assert all(1.0 < b / a <= 1.25 + 1e-9 for a, b in zip(rates, rates[1:]))
    assert level_grid(8, 8, 0.1, integer=True) == [8.0]
    with pytest.raises(ValueError):
        level_grid(10, 2, 0.1, integer=True)


def test_stage_indices_grow_and_name_the_rate_in_the_plan():
    assert [stage_index(last, 5, 9, cyclic=False) for last in (None, 0, 7)] == [0, 1, 8]
    picked, last = [], None
    for plan_index in (4, 6, 5, 1, 1):
        last = stage_index(last, plan_index, 9, cyclic=True)
        picked.append(last)
    assert picked == [4, 6, 14, 19, 28]
    assert [i % 9 for i in picked] == [4, 6, 5, 1, 1]


def _curve(limit: int, n: int = 200, sharp: bool = True):
    """A server meeting the target up to position ``limit`` and missing it above."""
    def measure(position: int) -> Probe:
        ok = n if position <= limit else (n // 2 if sharp else int(n * 0.94))
        return Probe(position, float(position + 1), n, ok)
    return measure


def _drive(search: Bisection, measure) -> Bisection:
    while (position := search.next_position()) is not None:
        search.record(measure(position))
    return search


@pytest.mark.parametrize("limit", [-1, 0, 1, 7, 18, 30, 31])
def test_bisection_finds_the_limit_within_its_probe_budget(limit):
    search = _drive(Bisection([float(i + 1) for i in range(32)]), _curve(limit))
    answer = search.answer()
    assert len(search.probes) <= plain_bisection_probes(32) == 6
    if limit < 0:
        assert search.stop == "none_meets" and answer.limit is None
    elif limit == 31:
        assert search.stop == "all_meet" and answer.limit == 32.0 and answer.high is None
    else:
        assert search.stop == "resolution"
        assert answer.limit == limit + 1 and (answer.low, answer.high) == (limit + 1, limit + 2)
    assert len({p.position for p in search.probes}) == len(search.probes)   # never twice


@pytest.mark.parametrize("offset", [-9, -3, -1, 0, 1, 2, 10])
def test_a_seed_near_the_limit_takes_fewer_probes(offset):
    levels = [float(i + 1) for i in range(64)]
    plain = _drive(Bisection(levels), _curve(30))
    seeded = _drive(Bisection(levels, 30 + offset), _curve(30))
    assert seeded.answer().limit == plain.answer().limit == 31.0
    assert seeded.probes[0].position == 30 + offset
    if offset in (0, 1):   # the prediction right, or one step high: met, then missed
        assert len(seeded.probes) == 2 < len(plain.probes)
    # galloping 1, 2, 4 ... away from the seed, then bisecting: about 2 log2(offset) probes
    assert len(seeded.probes) <= 2 * math.ceil(math.log2(abs(offset) + 1)) + 2


def test_two_undecided_probes_in_a_row_stop_the_search():
    # 40 requests per probe: 100% is still "undecided" (Wilson's low end is below 95%)
    def measure(position):
        return Probe(position, float(position + 1), 40, 40 if position <= 20 else 37)
    search = _drive(Bisection([float(i + 1) for i in range(64)]), measure)
    assert search.stop == "undecided"
    answer = search.answer()
    assert answer.limit is not None and answer.low is None   # nothing decided met
    assert not any(p.decided for p in search.probes[-2:])


def test_a_probe_missed_because_of_the_generator_is_no_measurement():
    probe = Probe(3, 8.0, 500, 500, cause="the generator saturated (worker w0 ...)")
    assert probe.verdict == "missed" and probe.decided
    assert probe.label().startswith("missed, because the generator saturated")
    search = Bisection([1.0, 2.0, 4.0, 8.0])
    search.record(Probe(2, 4.0, 500, 500))
    search.record(probe)
    assert search.next_position() is None and search.stop == "resolution"
    answer = search.answer()
    assert answer.limit == 4.0 and answer.high == 8.0 and "generator" in answer.high_cause


def test_the_server_stopping_ends_the_search_and_keeps_what_was_measured():
    search = Bisection([1.0, 2.0, 4.0, 8.0, 16.0])
    search.record(Probe(2, 4.0, 300, 300))
    search.record(Probe(3, 8.0, 40, 0, down=True, cause="the server stopped answering"))
    assert search.next_position() is None and search.stop == "server_down"
    assert search.answer().limit == 4.0


def test_no_level_meets_names_the_best_level():
    search = Bisection([1.0, 2.0, 4.0])
    for position, met in ((1, 150), (0, 180)):
        search.record(Probe(position, [1.0, 2.0, 4.0][position], 200, met))
    assert search.next_position() is None and search.stop == "none_meets"
    best = search.answer().best
    assert best.level == 1.0 and best.attainment == 0.9


def test_start_position_is_the_nearest_level():
    levels = [1.0, 2.0, 4.0, 8.0, 16.0]
    assert start_position(levels, 0) is None and start_position(levels, None) is None
    assert start_position(levels, 7.0) == 3 and start_position(levels, 100) == 4
