"""SGLang's scheduling knobs in virtual time (engine steps, no clock): the radix cache's
token-granular prefix reuse against vLLM's 16-token blocks, and a prefill batch that runs alone
(decodes wait) unless --enable-mixed-chunk, against mixed batches."""
from __future__ import annotations

from servelab.sim.engine.engine import Engine
from servelab.specs.engine_config import build_kind_engine_config
from servelab.specs.server_kinds import SGLANG, VLLM

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def _engine(kind, args) -> Engine:
    return Engine(build_kind_engine_config("L40S", MODEL, args, kind))


def _run(engine: Engine, now: float = 0.0, until=None) -> float:
    while engine.has_unfinished() and not (until and until()):
        now += engine.step(now).duration_s
    return now


def test_shared_prefix_of_100_tokens_reuses_100_on_sglang_and_96_on_vllm():
    prefix = list(range(1000, 1100))
    cached = {}
    for kind, args in ((VLLM, ["--max-model-len", "8192"]), (SGLANG, ["--context-length", "8192"])):
        engine = _engine(kind, args)
        engine.add_request("a", prefix + [1, 2, 3, 4, 5], 4, ignore_eos=True)
        now = _run(engine)
        second = engine.add_request("b", prefix + [7, 8, 9], 4, ignore_eos=True)
        _run(engine, now)
        cached[kind.name] = second.num_cached_tokens
    assert cached == {"vllm": 96, "sglang": 100}


def _decode_stall(args) -> tuple[int, int, float]:
    """A decodes alone; then B's 3000-token prompt arrives. Returns (steps that ran B's
    prefill, how many of them also gave A a token, A's longest gap between tokens in s)."""
    engine = _engine(SGLANG, args)
    a = engine.add_request("a", list(range(50)), 200, ignore_eos=True)
    now = _run(engine, until=lambda: a.num_output_tokens >= 5)
    b = engine.add_request("b", list(range(5000, 8000)), 2, ignore_eos=True)
    prefill_steps = shared = 0
    last_a, gap = now, 0.0
    a_after_b = False
    while not a_after_b:
        out = engine.step(now)
        now += out.duration_s
        got_a = any(e.request_id == "a" for e in out.events)
        if out.shape.prefill_tokens:
            prefill_steps += 1
            shared += got_a
        if got_a:
            gap, last_a = max(gap, now - last_a), now
            a_after_b = b.first_token_time is not None
    return prefill_steps, shared, gap


def test_without_mixed_chunk_decodes_wait_out_the_prefill_batch():
    base = ["--context-length", "8192", "--chunked-prefill-size", "1024"]
    steps_off, shared_off, gap_off = _decode_stall(base)
    steps_on, shared_on, gap_on = _decode_stall(base + ["--enable-mixed-chunk"])
    assert steps_off == steps_on == 3            # 3000 prompt tokens in 1024-token chunks
    assert shared_off == 0 and shared_on == 3    # A rides along only in mixed batches
    # A's token gap spans all three prefill steps, against one (mixed) step.
    assert gap_off > 2.5 * gap_on
