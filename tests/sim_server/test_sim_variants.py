"""The server built from variant files: instances and DP ranks become engines, flags layer on top."""
import pytest

from servelab.sim.server.server import build_server


def test_two_instances_and_dp2_variants_give_two_engines():
    two = build_server(variant="two_instances", hardware="H100")
    assert len(two.engines) == 2 and two.config.data_parallel_size == 1
    assert [e.engine_index for e in two.engines] == [0, 1]
    dp2 = build_server(variant="dp2", hardware="H100")
    assert len(dp2.engines) == 2 and dp2.config.data_parallel_size == 2
    assert dp2.served.max_model_len == 8192


def test_flags_after_a_variant_override_it_and_precision_sets_divergence():
    fp8 = build_server(variant="fp8", hardware="H100", serve_args=["--max-model-len", "2048"])
    assert fp8.served.max_model_len == 2048
    assert fp8.config.quant.name == "fp8-w8a8" and fp8.divergence > 0
    assert fp8.divergence_salt == "fp8"
    assert build_server(variant="bf16", hardware="H100").divergence == 0.0
    assert build_server(variant="fp8", hardware="H100", output_divergence=0.0).divergence == 0.0


def test_acceptance_hint_follows_the_prompts_content():
    import random

    from servelab.core.paths import DATA_DIR
    from servelab.sim.server.spec_hint import equivalent_acceptance, expected_accepted, ngram_repetition

    assert ngram_repetition([1, 2, 3, 4, 5, 6]) == 0.0
    assert ngram_repetition([1, 2, 3] * 10) == 25 / 28  # all but the first 3 of 28 3-grams
    assert equivalent_acceptance([0.5] * 4) == pytest.approx(0.5)
    rates = [0.77, 0.584, 0.533]
    assert expected_accepted([equivalent_acceptance(rates)] * 3) == pytest.approx(
        expected_accepted(rates))

    def server(spec):
        return build_server(hardware="H100", model="Qwen/Qwen2.5-7B-Instruct", serve_args=[
            "--max-model-len", "8192", "--speculative-config", spec])

    ngram = server('{"method": "ngram", "num_speculative_tokens": 3}')
    draft = server('{"method": "draft_model", "model": "Qwen/Qwen2.5-0.5B-Instruct", '
                   '"num_speculative_tokens": 5}')
    tok = ngram.tokenizer
    prose = tok.encode((DATA_DIR / "modern_prose.txt").read_text())[5000:6000]
    rng = random.Random(0)
    soup = [rng.randrange(tok.vocab_size) for _ in range(1000)]
    soup_text = tok.encode(tok.decode(soup))  # random ids sent as their text
    for srv in (ngram, draft):
        english = srv.spec_acceptance_hint(prose)
        assert english == pytest.approx(srv.spec_base, abs=0.02)  # prose: the defaults
        assert srv.spec_acceptance_hint(soup) == pytest.approx(0.3 * srv.spec_base, abs=0.01)
        assert srv.spec_acceptance_hint(soup_text) < 0.5 * english
        assert srv.spec_acceptance_hint(prose[:100]) is None  # too short to tell
    # Prompt lookup gains on text that repeats itself; a draft model does not.
    assert ngram.spec_acceptance_hint([7, 8, 9, 10] * 50) > 0.9
    assert draft.spec_acceptance_hint(prose[:300] * 3) == pytest.approx(draft.spec_base, abs=0.01)
    plain = build_server(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct",
                         serve_args=["--max-model-len", "4096"])
    assert plain.spec_acceptance_hint([7, 8, 9, 10] * 50) is None
