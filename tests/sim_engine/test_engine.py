"""Engine: the public API the HTTP server drives, finish reasons, timings, determinism."""
import json

import pytest

from servelab.sim.engine import Engine, build_engine_config, least_outstanding, make_engines, pick_engine

QWEN = "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture(scope="module")
def h100_config():
    return build_engine_config("H100", QWEN, ["--max-model-len", "8192"])


def drain(engine, now=0.0, limit=100_000):
    """Step until idle; returns (end time, events by request, outputs)."""
    chunks, outs = {}, []
    for _ in range(limit):
        if not engine.has_unfinished():
            break
        out = engine.step(now)
        outs.append((now, out))
        now += out.duration_s
        for ev in out.events:
            chunks.setdefault(ev.request_id, []).append(ev)
    return now, chunks, outs


def test_finish_reasons_follow_vllm(h100_config):
    e = Engine(h100_config, seed=1)
    e.add_request("len", list(range(100)), max_tokens=5)
    e.add_request("eos", list(range(100)), max_tokens=50, eos_after=7)
    e.add_request("ign", list(range(100)), max_tokens=9, eos_after=3, ignore_eos=True)
    e.add_request("min", list(range(100)), max_tokens=50, eos_after=2, min_tokens=6)
    e.add_request("cap", list(range(100)), max_tokens=4, eos_after=4)  # length is checked first
    _, chunks, _ = drain(e)
    result = {rid: (sum(ev.new_tokens for ev in evs), evs[-1].finish_reason) for rid, evs in chunks.items()}
    assert result == {"len": (5, "length"), "eos": (7, "stop"), "ign": (9, "length"),
                      "min": (6, "stop"), "cap": (4, "length")}
    assert all(not ev.finished for evs in chunks.values() for ev in evs[:-1])
    assert e.stats.request_success_total == {"stop": 2, "length": 3, "abort": 0}
    assert e.stats.generation_tokens_total == 31 and e.stats.prompt_tokens_total == 500


def test_step_output_and_timings(h100_config):
    e = Engine(h100_config, seed=0)
    seq = e.add_request("r", list(range(3000)), max_tokens=3, arrival_time=10.0)
    out = e.step(10.0)
    # 3000 prompt tokens fit the 8192 budget: the whole prompt in one step, first token at its end.
    assert out.shape.prefill_tokens == 3000 and out.shape.decode_tokens == 0 and out.shape.num_seqs == 1
    assert out.duration_s > 0
    assert [ (ev.request_id, ev.new_tokens, ev.finished) for ev in out.events] == [("r", 1, False)]
    assert seq.first_scheduled_time == 10.0 and seq.first_token_time == pytest.approx(10.0 + out.duration_s)
    assert e.get_sequence("r") is seq
    t = 10.0 + out.duration_s
    out2 = e.step(t)
    assert out2.shape.decode_tokens == 1 and out2.duration_s < out.duration_s
    t += out2.duration_s
    out3 = e.step(t)
    assert out3.finished == [seq] and seq.finish_time == pytest.approx(t + out3.duration_s)
    assert seq.finish_reason == "length" and e.get_sequence("r") is None and not e.has_unfinished()
    assert e.step(t + 1).duration_s == 0 and e.step(t + 1).events == []


def test_long_prompts_are_chunked_by_the_token_budget():
    cfg = build_engine_config("L40S", QWEN, ["--max-model-len", "8192"])  # budget 2048
    e = Engine(cfg)
    e.add_request("r", list(range(5000)), max_tokens=2)
    _, chunks, outs = drain(e)
    assert [o.shape.prefill_tokens for _, o in outs[:3]] == [2048, 2048, 904]
    assert [len(o.events) for _, o in outs[:3]] == [0, 0, 1]


def test_abort(h100_config):
    e = Engine(h100_config)
    e.add_request("a", list(range(50)), max_tokens=100)
    e.add_request("b", list(range(1000, 1050)), max_tokens=100)
    e.step(0.0)
    assert e.abort_request("a", now=0.1) and not e.abort_request("a")
    e.add_request("w", list(range(2000, 2050)), max_tokens=100)
    assert e.abort_request("w")  # still waiting
    assert e.stats.num_running == 1 and e.stats.num_waiting == 0
    assert e.stats.request_success_total["abort"] == 2
    _, chunks, _ = drain(e, 0.1)
    assert set(chunks) == {"b"}
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks


def test_bad_requests_are_refused(h100_config):
    e = Engine(h100_config)
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        e.add_request("x", list(range(8000)), max_tokens=500)
    with pytest.raises(ValueError, match="at least one token"):
        e.add_request("x", [], max_tokens=5)
    e.add_request("x", [1, 2, 3], max_tokens=5)
    with pytest.raises(ValueError, match="already"):
        e.add_request("x", [1, 2, 3], max_tokens=5)


def _trace(config, seed):
    e = Engine(config, seed=seed)
    for i in range(12):
        e.add_request(f"r{i}", list(range(i * 1000, i * 1000 + 200 + 37 * i)), max_tokens=40 + i, arrival_time=0.0)
    _, chunks, outs = drain(e)
    return [round(o.duration_s, 12) for _, o in outs], {k: [ev.new_tokens for ev in v] for k, v in chunks.items()}


def test_deterministic_for_a_seed():
    cfg = build_engine_config("H100", QWEN, ["--max-model-len", "8192", "--speculative-config",
                                            json.dumps({"method": "ngram", "num_speculative_tokens": 4})])
    assert _trace(cfg, 7) == _trace(cfg, 7)
    assert _trace(cfg, 7) != _trace(cfg, 8)  # acceptance draws depend on the seed


def test_spec_decoding_emits_accepted_tokens_in_one_chunk_and_counts_them():
    cfg = build_engine_config("H100", QWEN, ["--max-model-len", "8192", "--speculative-config", json.dumps(
        {"method": "draft_model", "model": "Qwen/Qwen2.5-0.5B-Instruct", "num_speculative_tokens": 3})])
    e = Engine(cfg, seed=3)
    e.add_request("sure", list(range(64)), max_tokens=40, spec_acceptance=1.0)
    e.add_request("never", list(range(500, 564)), max_tokens=10, spec_acceptance=0.0)
    _, chunks, _ = drain(e)
    sure = [ev.new_tokens for ev in chunks["sure"]]
    assert sure[0] == 1 and set(sure[1:-1]) == {4} and sum(sure) == 40  # 3 accepted + 1 bonus
    assert [ev.new_tokens for ev in chunks["never"]] == [1] * 10
    s = e.stats
    assert s.spec_num_drafts_total > 0 and s.spec_num_draft_tokens_total == 3 * s.spec_num_drafts_total
    assert s.spec_accepted_per_pos_total[0] >= s.spec_accepted_per_pos_total[1] >= s.spec_accepted_per_pos_total[2]
    assert sum(s.spec_accepted_per_pos_total) == s.spec_num_accepted_tokens_total
    assert s.generation_tokens_total == 50


def test_default_acceptance_gives_the_expected_mean_acceptance_length():
    cfg = build_engine_config("H100", "meta-llama/Llama-3.1-8B-Instruct", ["--max-model-len", "8192",
        "--speculative-config", '{"model":"RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3","num_speculative_tokens":3}'])
    e = Engine(cfg, seed=11)
    for i in range(40):
        e.add_request(f"r{i}", list(range(i * 1000, i * 1000 + 50)), max_tokens=200)
    drain(e)
    s = e.stats
    # vllm PR #24344: EAGLE k=3 mean acceptance length 2.46, per position 0.77/0.45/0.24.
    assert 1 + s.spec_num_accepted_tokens_total / s.spec_num_drafts_total == pytest.approx(2.46, abs=0.1)
    rates = [a / s.spec_num_drafts_total for a in s.spec_accepted_per_pos_total]
    assert rates == pytest.approx([0.77, 0.45, 0.24], abs=0.04)


def test_data_parallel_engines_and_least_outstanding_balancing():
    cfg = build_engine_config("H100", QWEN, ["--max-model-len", "8192", "-dp", "2"])
    engines = make_engines(cfg, seed=5)
    assert [e.engine_index for e in engines] == [0, 1]
    assert least_outstanding([3, 1, 1]) == 1 and least_outstanding([0, 0]) == 0
    for i in range(5):
        engines[pick_engine(engines)].add_request(f"r{i}", list(range(10)), max_tokens=3)
    assert [e.num_outstanding for e in engines] == [3, 2]


def test_reset_prefix_cache_drops_hits_for_a_repeated_prompt(h100_config):
    e = Engine(h100_config, seed=0)
    prompt = list(range(5000, 5400))  # 25 full blocks

    def hit_tokens(rid):
        e.add_request(rid, prompt, max_tokens=4)
        before = e.stats.prefix_cache_hits_total
        drain(e)
        return e.stats.prefix_cache_hits_total - before

    assert hit_tokens("first") == 0
    assert hit_tokens("again") == 384  # 24 blocks: a hit always leaves a token to compute
    assert e.reset_prefix_cache()
    assert hit_tokens("after-reset") == 0
    assert hit_tokens("cached-again") == 384


def test_reset_prefix_cache_fails_while_requests_run_unless_they_are_preempted(h100_config):
    e = Engine(h100_config, seed=0)
    e.add_request("warm", list(range(320)), max_tokens=2)
    drain(e)
    e.add_request("busy", list(range(1000, 1320)), max_tokens=50)
    now = e.step(0.0).duration_s
    assert not e.reset_prefix_cache()  # blocks in use: refused, nothing forgotten
    assert e.block_manager.lookup_prefix(e.requests["busy"])  # its own blocks are cached
    assert e.reset_prefix_cache(reset_running_requests=True)
    assert e.stats.num_running == 0 and e.stats.num_waiting == 1
    assert e.stats.num_preemptions_total == 1
    _, chunks, _ = drain(e, now)
    assert sum(ev.new_tokens for ev in chunks["busy"]) == 49  # the rest of its 50 tokens
    e.add_request("cold", list(range(320)), max_tokens=2)
    before = e.stats.prefix_cache_hits_total
    drain(e)
    assert e.stats.prefix_cache_hits_total == before  # "warm" was forgotten
