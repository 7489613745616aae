"""The virtual-time runner: open and closed loops, client-side records, engine samples, DP."""
import pytest

from servelab.sim.engine import build_engine_config, make_engines
from servelab.core.quantiles import quantile_cont
from servelab.sim.engine.virtual import VirtualRequest, VirtualRunner, prompt_ids_for
from servelab.sim.engine.virtual_users import (
    UserTurn,
    VirtualUsers,
    run_closed_loop,
    run_open_loop,
)

QWEN = "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture(scope="module")
def cfg():
    return build_engine_config("L40S", QWEN, ["--max-model-len", "4096"])


def test_open_loop_records_every_chunk(cfg):
    reqs = [VirtualRequest(prompt_len=200, output_len=20, arrival_s=0.5 * i) for i in range(6)]
    res = run_open_loop(make_engines(cfg), reqs, sample_interval_s=0.1)
    assert len(res.records) == 6
    for i, r in enumerate(res.records):
        assert r.sent_s == 0.5 * i
        assert r.output_tokens == sum(r.chunk_tokens) == 20 and len(r.chunk_times) == 20
        assert r.finish_reason == "length" and r.prompt_tokens == 200
        assert r.sent_s < r.first_token_s == r.chunk_times[0] <= r.end_s == r.chunk_times[-1]
        assert r.chunk_times == sorted(r.chunk_times)
        assert r.ttft > 0.002 and r.tpot == pytest.approx((r.end_s - r.first_token_s) / 19)
        assert len(r.itls) == 19 and r.queue_s >= 0
    # Sampled gauges: something ran, and everything drained by the end.
    assert max(s.num_running for s in res.samples) >= 1
    assert res.samples[-1].generation_tokens_total == 120
    assert [s.t for s in res.samples[:3]] == pytest.approx([0.0, 0.1, 0.2])


def test_eos_and_output_length(cfg):
    reqs = [VirtualRequest(prompt_len=50, output_len=7, ignore_eos=False, max_tokens=100)]
    r = run_open_loop(make_engines(cfg), reqs).records[0]
    assert (r.output_tokens, r.finish_reason, r.max_tokens) == (7, "stop", 100)


def test_closed_loop_keeps_users_busy_and_stops_sending_at_the_end(cfg):
    res = run_closed_loop(make_engines(cfg), 4, lambda i: VirtualRequest(prompt_len=100, output_len=10),
                          duration_s=5.0, drain=True)
    assert all(r.sent_s < 5.0 for r in res.records)
    assert all(r.end_s is not None for r in res.records)
    # Each user sends its next request as soon as the previous one ends (think time 0).
    ends = sorted(r.end_s for r in res.records)
    sends = sorted(r.sent_s for r in res.records)[4:]
    assert sends == pytest.approx(ends[:len(sends)])
    running = [s.num_running for s in res.samples if 1.0 <= s.t < 4.5]
    assert min(running) >= 3


def test_closed_loop_from_an_iterator_ends_when_it_runs_out(cfg):
    reqs = iter([VirtualRequest(prompt_len=64, output_len=4) for _ in range(9)])
    res = run_closed_loop(make_engines(cfg), 3, reqs, duration_s=100.0, drain=True)
    assert len(res.records) == 9 and res.end_s < 5


def test_prefix_groups_share_ids_and_nothing_else():
    a = prompt_ids_for(VirtualRequest(prompt_len=100, output_len=1, prefix_group="sys", prefix_len=60), 0)
    b = prompt_ids_for(VirtualRequest(prompt_len=80, output_len=1, prefix_group="sys", prefix_len=60), 1)
    c = prompt_ids_for(VirtualRequest(prompt_len=100, output_len=1, prefix_group="other", prefix_len=60), 2)
    d = prompt_ids_for(VirtualRequest(prompt_len=100, output_len=1), 3)
    assert len(a) == 100 and len(b) == 80
    assert a[:60] == b[:60] and a[60] != b[60]
    assert not set(a) & set(c) and not set(a) & set(d)
    explicit = prompt_ids_for(VirtualRequest(prompt_len=3, output_len=1, prompt_token_ids=[5, 6, 7]), 4)
    assert list(explicit) == [5, 6, 7]


def test_two_engines_share_the_load(cfg):
    dp = build_engine_config("L40S", QWEN, ["--max-model-len", "4096", "-dp", "2"])
    reqs = [VirtualRequest(prompt_len=300, output_len=50, arrival_s=0.01 * i) for i in range(40)]
    res = run_open_loop(make_engines(dp, seed=1), reqs)
    per_engine = [sum(1 for r in res.records if r.engine_index == i) for i in (0, 1)]
    assert per_engine == [20, 20]
    assert {s.engine_index for s in res.samples} == {0, 1}
    one = run_open_loop(make_engines(cfg, seed=1), reqs)
    assert res.end_s < one.end_s


def test_until_cuts_the_run(cfg):
    reqs = [VirtualRequest(prompt_len=100, output_len=2000, arrival_s=0.0)]
    res = run_open_loop(make_engines(cfg), reqs, until_s=1.0)
    assert res.end_s == 1.0 and res.records[0].end_s is None and res.records[0].output_tokens > 10


def test_the_summaries_use_the_one_quantile_numpy_linear():
    assert quantile_cont([1, 2, 3, 4], 0.5) == 2.5
    assert quantile_cont([1, 2, 3, 4], 1.0) == 4 and quantile_cont([7], 0.99) == 7


def test_a_session_resends_its_history_and_an_overlong_request_is_rejected(cfg):
    users = VirtualUsers(VirtualRunner(make_engines(cfg)))
    chat = [UserTurn(VirtualRequest(100, 20, request_id="t1"), resend_history=True),
            UserTurn(VirtualRequest(50, 20, request_id="t2"), 0.5, resend_history=True)]
    users.add_session(chat, 0.0)
    users.add_session([UserTurn(VirtualRequest(5000, 20, request_id="big")),
                       UserTurn(VirtualRequest(100, 10, request_id="after"))], 1.0)
    res = users.run()
    by_id = {r.request_id: r for r in res.records}
    assert set(by_id) == {"t1", "t2", "after"} and [s.request_id for s in users.rejected] == ["big"]
    assert by_id["t2"].prompt_tokens == 100 + 20 + 50 and by_id["t2"].cached_tokens >= 16
    assert by_id["t2"].sent_s == pytest.approx(by_id["t1"].end_s + 0.5)
    assert by_id["after"].sent_s == pytest.approx(1.001)  # the user goes on at once


def test_a_drained_run_ends_when_the_client_got_the_last_chunk(cfg):
    # The client sees each chunk frontend_out_s after its step ends; a drained run's end_s must
    # include that, or finished() and the throughput window leave the last requests out.
    res = run_closed_loop(make_engines(cfg), 4, lambda i: VirtualRequest(prompt_len=100, output_len=10),
                          duration_s=2.0, drain=True)
    assert res.records and all(r.end_s is not None for r in res.records)
    assert res.end_s == max(r.end_s for r in res.records)
    assert len(res.finished()) == len(res.records)
    total = sum(r.output_tokens for r in res.records)
    assert res.output_throughput() * res.end_s == pytest.approx(total)
    reqs = [VirtualRequest(prompt_len=200, output_len=20, arrival_s=0.3 * i) for i in range(5)]
    open_res = run_open_loop(make_engines(cfg), reqs)
    assert len(open_res.finished()) == 5 and open_res.samples[-1].t == open_res.end_s


def test_max_in_flight_holds_arrivals_back_first_come_first_served(cfg):
    reqs = [VirtualRequest(prompt_len=100, output_len=30, arrival_s=0.01 * i, request_id=f"r{i}")
            for i in range(8)]
    free = run_open_loop(make_engines(cfg), reqs)
    assert [(r.sent_s, r.scheduled_s) for r in free.records] == [(q.arrival_s, None) for q in reqs]
    res = run_open_loop(make_engines(cfg), reqs, max_in_flight=2)
    recs = {r.request_id: r for r in res.records}
    assert len(recs) == 8 and all(r.end_s is not None for r in recs.values())
    assert all(recs[q.request_id].scheduled_s == q.arrival_s for q in reqs)
    # Never more than two between sending and the last chunk received.
    events = sorted([(r.sent_s, 1) for r in recs.values()] + [(r.end_s, -1) for r in recs.values()])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == 2
    # The first two go on time; each later one goes when an earlier one's last chunk arrives,
    # in arrival order.
    assert recs["r0"].send_delay_s == 0 and recs["r1"].send_delay_s == 0
    ends = sorted(r.end_s for r in recs.values())
    sends = [recs[f"r{i}"].sent_s for i in range(2, 8)]
    assert sends == sorted(sends) and sends == pytest.approx(ends[:6])
    assert all(recs[f"r{i}"].send_delay_s > 0.05 for i in range(2, 8))
    assert res.end_s > free.end_s and res.dropped == []


def test_a_capped_request_still_waiting_at_its_give_up_time_is_dropped(cfg):
    from servelab.sim.engine.virtual import InFlightCap, VirtualRunner

    runner = VirtualRunner(make_engines(cfg))
    cap = InFlightCap(1)
    for i in range(4):
        runner.submit(VirtualRequest(prompt_len=100, output_len=200, request_id=f"r{i}",
                                     class_name="chat"), 0.01 * i, cap, give_up_s=0.5)
    res = runner.run()
    assert [r.request_id for r in res.records] == ["r0"]
    assert [(d.request_id, d.class_name, d.scheduled_s, d.dropped_s) for d in res.dropped] == \
        [("r1", "chat", 0.01, 0.5), ("r2", "chat", 0.02, 0.5), ("r3", "chat", 0.03, 0.5)]
    assert res.records[0].end_s > 0.5 and cap.in_flight == 0 and not cap.waiting
    with pytest.raises(ValueError, match="at least 1"):
        InFlightCap(0)
