"""Issue 22, second pass: what the H200 runs kept in servers/captured/h200_20261202/ say about the
cells still outside target, read off the recorded rows (per-request gap statistics, spans,
iteration lines) and, where the model already agrees, checked against it
(bench/fidelity_steps.py). bench/results/fidelity_20261203/README.md, "After, second pass",
has the numbers and what was tried."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "servers" / "captured" / "h200_20261202"
VARIANTS = ("bf16", "fp8", "gptq_int4", "awq_int4")
sys.path.insert(0, str(REPO / "bench"))
from capture_export import open_export  # noqa: E402  (a bench script, not a package)


def _one_user_rows(variant: str, sql: str) -> list[tuple]:
    rows = []
    for run in sorted(p for p in (CAPTURE / variant).iterdir() if (p / "runs.parquet").is_file()):
        con = open_export(run)
        try:
            rows += con.execute(sql).fetchall()
        finally:
            con.close()
    return rows


def test_one_user_long_gaps_come_with_time_not_with_each_request():
    """At one user the real ITL p99 is 1.3-2.0x TPOT (the model's 1.0x: 0.50-0.80). The long
    gaps are not one per request (a fixed extra step after the first token, say): the share of
    requests with a gap over 1.6x TPOT grows with how long the request streams, about a third
    of those under 0.5 s and nearly all of those over 0.8 s (every 1-user request of the four
    variants), as a stall that comes every ~0.5-1 s of wall time would. The per-request
    gap statistics say no more (the chunk arrays were not kept), so it stays unmodelled."""
    short, long_ = [], []
    for variant in VARIANTS:
        rows = _one_user_rows(variant, "SELECT (last_token_unix - first_token_unix) * 1000, "
                              "output_tokens, gap_token_max_ms FROM requests WHERE level = 1 "
                              "AND NOT warmup AND output_tokens > 2")
        tpot = statistics.median(ms / (n - 1) for ms, n, _ in rows)
        for ms, _, gap in rows:
            if ms < 500:
                short.append(gap > 1.6 * tpot)
            elif ms >= 800:
                long_.append(gap > 1.6 * tpot)
    assert len(short) > 100 and len(long_) > 30
    assert statistics.mean(short) < 0.5 < 0.8 < statistics.mean(long_)


def test_one_user_hand_off_is_short_per_prompt_token():
    """At one user the spans' "server other" (the server's TTFT less queue and prefill: the
    hand-off to the engine core and the first token's way back) is ~2.6 ms + ~2.8 us per prompt
    token in every variant, against the calibration's 8.6 us per prompt token of API-server CPU
    (what cpu.csv.gz says per stage, tests/sim_engine/test_capture_api_server.py): the idle
    hand-off's api_prompt_token_s (2.8 us); the rest comes onto the path only on a loop busy
    with output (tests/sim_engine/test_capture_hand_off.py, README "Third pass")."""
    for variant in VARIANTS:
        rows = _one_user_rows(
            variant, "SELECT s.prompt_tokens, (s.time_to_first_token_s - s.time_in_queue_s - "
            "s.time_in_model_prefill_s) * 1000 FROM requests r JOIN server_spans s USING "
            "(run_id, request_id) WHERE r.level = 1")
        n = [float(p) for p, _ in rows]
        ms = [m for _, m in rows]
        slope, intercept = statistics.linear_regression(n, ms)
        assert len(rows) > 60, variant
        assert 2.0 < intercept < 3.5 and 2.0e-3 < slope < 4.0e-3, (variant, intercept, slope)


@pytest.fixture(scope="module")
def bf16_steps(tmp_path_factory):
    import fidelity_steps

    work = tmp_path_factory.mktemp("steps")
    return {run: fidelity_steps.compare(CAPTURE / "bf16", "bf16", run, work)
            for run in ("code_gen", "rag_chat")}


def test_predicted_steps_match_the_recorded_ones_up_to_64_users(bf16_steps):
    """sim.engine.scheduler's shared 8,192-token budget, sim.engine.pipeline's async hand-off
    and sim.engine.frontend's API server give, at 8-64 users, the recorded step mix: the share
    of steps that carry a prefill and the shares by prefill size within 0.02 up to 32 users
    (0.08 and 0.04 at 64, where the model's bursts are already smaller: more steps with less
    prefill each), the mean decodes per step within 10% and the step rate within 7%."""
    for run, level in (("code_gen", 8), ("code_gen", 32), ("rag_chat", 16), ("rag_chat", 64)):
        real, pred = bf16_steps[run][level]
        share, band = (0.08, 0.04) if level == 64 else (0.02, 0.02)
        assert pred["steps_per_s"] == pytest.approx(real["steps_per_s"], rel=0.07), (run, level)
        assert pred["with_prefill"] == pytest.approx(real["with_prefill"], abs=share)
        for r, p in zip(real["bands"], pred["bands"]):
            assert p == pytest.approx(r, abs=band), (run, level)
        assert pred["decodes"] == pytest.approx(real["decodes"], rel=0.1), (run, level)


def test_recorded_server_lets_new_requests_in_steadily_when_its_loop_saturates(bf16_steps):
    """code_gen's 256 users (the API server at 1.09 cores): the real engine takes new requests
    in many small prefill steps (31% of steps, almost none over 4,096 tokens) while they wait
    ~0.8 s in the API server; rag_chat's 256 users keep only ~127 requests decoding. The model
    holds them and releases floods of 4-8k-token prefill steps (its ITL p99 there 3.1-4.1x) and
    keeps ~195 decoding at rag_chat's 256 users: the API server's hand-off under saturation is
    what is left to model (README, "After, second pass")."""
    real, _ = bf16_steps["code_gen"][256]
    assert real["with_prefill"] > 0.25 and sum(real["bands"][3:]) < 0.01
    real, _ = bf16_steps["rag_chat"][256]
    assert real["decodes"] < 140
