"""The seed write-ups' findings on their own hardware, in virtual time (issue 13, item 6).

Write-up 1 (L40S, Qwen2.5-7B, BF16 / FP8-dynamic / GPTQ-Int4, concurrency 1-300) and write-up 2
(L4, Qwen2.5-7B with a Qwen2.5-0.5B draft) are here. Write-up 3 (L40S, Qwen3-14B BF16 against
AWQ, and raising --max-num-seqs) already runs on its own hardware in test_behaviours.py (its
behaviour 2); it is not repeated. Where the simulator disagrees with a write-up the test pins
what the simulator does and docs/simulator.md ("The write-ups' findings") says why: if such a
test fails, the model changed, and that section must change with it.

The load is the write-up's shape as traffic_profiles/quant_sweep.yaml plans it (prompts around
512 tokens, outputs around 256), closed loop, short virtual runs (the suite's budget).
"""
import json

QWEN = "Qwen/Qwen2.5-7B-Instruct"
VARIANTS = {"bf16": (QWEN, []), "fp8": (QWEN, ["--quantization", "fp8"]),
            "gptq": (QWEN + "-GPTQ-Int4", [])}
ARGS = ["--max-model-len", "8192"]
SWEEP = {"prompt": (384, 640), "output": (224, 288)}
DRAFT = ["--speculative-config", json.dumps(
    {"method": "draft_model", "model": "Qwen/Qwen2.5-0.5B-Instruct", "num_speculative_tokens": 5})]


_SWEEP: dict = {}


def l40s(closed) -> dict:
    """(variant, users) -> summary of the write-up-1 sweep, run once for the module's tests."""
    if not _SWEEP:
        # High levels run longer: their first synchronized wave must be over before measuring.
        for users, seconds in ((1, 24.0), (8, 24.0), (32, 24.0), (128, 40.0), (256, 40.0)):
            for name, (model, extra) in VARIANTS.items():
                _SWEEP[name, users] = closed("L40S", model, ARGS + extra, users, seconds,
                                             warmup_frac=0.4, **SWEEP)
    return _SWEEP


# Write-up 1: no variant wins every metric.
def test_gptq_int4_has_the_highest_throughput_at_low_and_moderate_load(closed):
    l40s_sweep = l40s(closed)
    for users in (1, 8, 32):
        tps = {v: l40s_sweep[v, users].throughput for v in VARIANTS}
        assert tps["gptq"] > tps["fp8"] > tps["bf16"], (users, tps)
    # W4A16 streams a quarter of BF16's weight bytes: at concurrency 1 it decodes >2x faster.
    assert l40s_sweep["bf16", 1].tpot_p50 > 2.0 * l40s_sweep["gptq", 1].tpot_p50


def test_fp8_has_the_best_latency_at_high_concurrency(closed):
    l40s_sweep = l40s(closed)
    for users in (128, 256):
        fp8 = l40s_sweep["fp8", users]
        for other in ("bf16", "gptq"):
            o = l40s_sweep[other, users]
            assert fp8.ttft_p50 < o.ttft_p50 and fp8.tpot_p50 < o.tpot_p50, (users, other)
            assert fp8.e2e_p50 < o.e2e_p50
    # Prefill runs on FP8 tensor cores, W4A16 dequantizes to BF16: FP8's first token comes
    # sooner under load, by a wide margin.
    assert l40s_sweep["gptq", 128].ttft_p50 > 1.5 * l40s_sweep["fp8", 128].ttft_p50


def test_known_disagreement_gptq_falls_behind_fp8_at_high_concurrency(closed):
    l40s_sweep = l40s(closed)
    """The write-up had GPTQ-Int4 ahead on throughput at every level up to 300; the simulator's
    roofline puts it behind FP8 once steps are compute-bound (docs/simulator.md says why and
    what would have to be true for the write-up's result)."""
    assert l40s_sweep["gptq", 256].throughput < l40s_sweep["fp8", 256].throughput
    assert l40s_sweep["gptq", 32].throughput > l40s_sweep["fp8", 32].throughput


# Write-up 2: speculative decoding pays at low concurrency only.
def test_draft_model_speculation_on_l4_gains_at_one_user_and_loses_at_high_load(closed):
    lengths = {"prompt": (200, 600), "output": (128, 256)}
    gains = {}
    for users, seconds in ((1, 40.0), (32, 40.0), (256, 50.0)):
        base = closed("L4", QWEN, ["--max-model-len", "4096"], users, seconds, **lengths)
        spec = closed("L4", QWEN, ["--max-model-len", "4096"] + DRAFT, users, seconds, **lengths)
        gains[users] = spec.throughput / base.throughput
        if users == 1:
            # The "2-3x lower latency" of the sales pitch holds here, on an idle GPU.
            assert base.tpot_p50 > 2.0 * spec.tpot_p50
            assert base.e2e_p50 > 2.0 * spec.e2e_p50
    # The gain shrinks as batching fills the GPU, and turns into a loss.
    assert gains[1] > gains[32] > 1.0, gains
    assert gains[256] < 0.9, gains
