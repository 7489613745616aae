"""servelab predict: virtual-time runs stored like measured ones, read by the analysis views."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    from servelab.cli import main

    db = tmp_path_factory.mktemp("predict") / "p.duckdb"
    for variant in ("bf16", "gptq_int4", "spec_ngram"):
        assert main(["predict", "--variant", variant, "--hardware", "L40S", "--profile",
                     str(DATA / "tiny.yaml"), "--db", str(db), "--tag", "suite=predict"]) == 0
    assert main(["predict", "--variant", "bf16", "--hardware", "L40S", "--profile",
                 str(DATA / "sessions.yaml"), "--db", str(db)]) == 0
    con = duckdb.connect(str(db))
    yield con
    con.close()


def _run(con, variant, profile="tiny"):
    return con.execute("SELECT run_id FROM runs WHERE variant = ? AND profile_name = ?",
                       [variant, profile]).fetchone()[0]


def test_run_is_flagged_and_described(predicted):
    rows = predicted.execute("SELECT variant, flags, status, target, hardware, gpus, tags['suite'] "
                             "FROM runs WHERE profile_name = 'tiny' ORDER BY variant").fetchall()
    assert [r[0] for r in rows] == ["bf16", "gptq_int4", "spec_ngram"]
    for variant, flags, status, target, hardware, gpus, suite in rows:
        assert flags == ["predicted"] and status == "completed"
        assert target == "predict://L40S" and hardware == "L40S" and gpus == 1
        assert suite == "predict"


def test_stages_and_requests_follow_the_profile(predicted):
    run = _run(predicted, "bf16")
    stages = predicted.execute("SELECT stage, kind, level, measure_start_unix - started_unix, "
                               "measure_end_unix - measure_start_unix FROM stages WHERE run_id = ? "
                               "ORDER BY stage", [run]).fetchall()
    assert [(s, k, lv) for s, k, lv, _, _ in stages] == [(0, "concurrency", 1), (1, "concurrency", 4)]
    # the window opens at reached + warm-up, reached at the generator's first 50 ms user check
    assert all(w == pytest.approx(0.55) and h == pytest.approx(2.0) for *_, w, h in stages)
    rows = predicted.execute(
        "SELECT prompt_tokens, prompt_tokens_target, output_tokens, output_tokens_target, "
        "chunk_offsets_ms, chunk_tokens, ttft_ms, e2e_ms, error_kind, warmup, sent_unix, "
        "first_token_unix FROM requests WHERE run_id = ?", [run]).fetchall()
    assert len(rows) > 10
    for (p, pt, o, ot, offsets, tokens, ttft, e2e, err, warm, sent, first) in rows:
        assert err is None and p == pt and o == ot == sum(tokens)
        assert len(offsets) == len(tokens) and offsets == sorted(offsets)
        assert ttft == pytest.approx(offsets[0]) and e2e == pytest.approx(offsets[-1])
        assert (first - sent) * 1000 == pytest.approx(ttft, abs=1e-3)  # epoch doubles: ~0.2 us
    assert any(r[9] for r in rows) and not all(r[9] for r in rows)  # warm-up rows exist


def test_analysis_views_accept_predictions(predicted):
    summary = predicted.execute(
        "SELECT r.variant, s.stage, s.requests, s.tpot_p50_ms, s.output_tokens_per_s "
        "FROM stage_summary s JOIN runs r USING (run_id) "
        "WHERE s.class_name = '(all)' AND r.profile_name = 'tiny' ORDER BY 1, 2").fetchall()
    by = {(v, st): (n, tpot, tps) for v, st, n, tpot, tps in summary}
    assert set(by) == {(v, s) for v in ("bf16", "gptq_int4", "spec_ngram") for s in (0, 1)}
    assert all(n > 0 and tps > 0 for n, _, tps in by.values())
    # W4A16 streams fewer weight bytes per step: faster decoding at concurrency 1.
    assert by[("gptq_int4", 0)][1] < by[("bf16", 0)][1]
    timeline = predicted.execute(
        "SELECT count(*), max(running), max(kv_cache_usage) FROM server_timeline WHERE run_id = ?",
        [_run(predicted, "bf16")]).fetchone()
    assert timeline[0] >= 4 and timeline[1] >= 1 and timeline[2] > 0
    spec = predicted.execute("SELECT max(spec_mean_acceptance_length) FROM server_timeline "
                             "WHERE run_id = ?", [_run(predicted, "spec_ngram")]).fetchone()[0]
    assert spec is not None and spec > 1
    multi = predicted.execute("SELECT count(*) FROM requests WHERE run_id = ? AND "
                              "list_max(chunk_tokens) > 1", [_run(predicted, "spec_ngram")]).fetchone()
    assert multi[0] > 0  # speculative decoding puts several tokens in one chunk


def test_open_loop_sessions_and_rejections(predicted):
    run = _run(predicted, "bf16", "sessions")
    rows = predicted.execute(
        "SELECT class_name, session_id, turn, prompt_tokens, cached_tokens, scheduled_unix, "
        "sent_unix, arrival_status, http_status, error_kind FROM requests WHERE run_id = ? "
        "ORDER BY sent_unix", [run]).fetchall()
    chats = [r for r in rows if r[0] == "chat"]
    long = [r for r in rows if r[0] == "too_long"]
    assert long and all(r[8] == 400 and r[9] == "http_400" for r in long)
    assert all(r[8] == 200 and r[9] is None for r in chats)
    assert all(r[7] == "on_time" for r in rows)
    firsts = [r for r in chats if r[2] == 1]
    assert firsts and all(r[5] == pytest.approx(r[6]) for r in firsts)
    later = [r for r in chats if r[2] > 1]
    assert later and all(r[5] is None for r in later)
    by_session = {}
    for r in chats:
        by_session.setdefault(r[1], []).append(r)
    grown = [turns for turns in by_session.values() if len(turns) > 1]
    assert grown
    for turns in grown:
        turns.sort(key=lambda r: r[2])
        # Each turn resends the history, and the prefix cache serves the part already computed.
        assert all(b[3] > a[3] for a, b in zip(turns, turns[1:]))
        assert all(b[4] >= 16 for b in turns[1:])


def test_predictions_are_deterministic(tmp_path):
    from servelab.orchestration.predict import Predictor
    from servelab.specs.variants import load_variant

    def ttfts():
        p = Predictor(load_variant("fp8"), "A10G", DATA / "tiny.yaml")
        result, _ = p.run()
        return [(r.request_id, r.ttft, r.e2e) for r in result.records]

    assert ttfts() == ttfts()


def test_max_in_flight_holds_open_loop_arrivals_back(tmp_path):
    from servelab.orchestration.predict import LATE_MS, predict
    from servelab.specs.variants import load_variant

    db = tmp_path / "capped.duckdb"
    predict(load_variant("bf16", environ={}), "L40S", DATA / "capped.yaml", db)
    con = duckdb.connect(str(db))
    rows = con.execute(
        "SELECT stage, scheduled_unix, sent_unix, done_unix, arrival_status, error_kind "
        "FROM requests ORDER BY scheduled_unix").fetchall()
    con.close()
    assert len(rows) == 24  # 8/s for 1.5 s, two stages: every arrival is accounted for
    sent = [r for r in rows if r[5] is None]
    dropped = [r for r in rows if r[5] == "dropped"]
    assert {r[4] for r in dropped} == {"dropped"} and all(r[2] is None for r in dropped)
    # Only the first stage drops (at its end); the last one waits for the run to drain.
    assert dropped and {r[0] for r in dropped} == {0} and all(r[0] == 1 or r[2] for r in sent)
    stage1 = [r for r in sent if r[0] == 1]
    assert len(stage1) == 12
    late = [r for r in sent if r[4] == "late"]
    assert late and all((r[2] - r[1]) * 1000 > LATE_MS for r in late)
    assert all((r[2] - r[1]) * 1000 <= LATE_MS for r in sent if r[4] == "on_time")
    # Never more than two in flight per stage.
    for stage in (0, 1):
        edges = sorted([(r[2], 1) for r in sent if r[0] == stage] +
                       [(r[3], -1) for r in sent if r[0] == stage])
        level = peak = 0
        for _, step in edges:
            level += step
            peak = max(peak, level)
        assert peak == 2
