"""The server built from variant files: instances and DP ranks become engines, flags layer on top."""
from servelab.sim.server import build_server


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


def test_ngram_acceptance_hint_follows_prompt_repetition():
    from servelab.sim.server import ngram_repetition

    assert ngram_repetition([1, 2, 3, 4, 5, 6]) == 0.0
    assert ngram_repetition([1, 2, 3] * 10) == 25 / 28  # all but the first 3 of 28 3-grams
    ngram = build_server(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct", serve_args=[
        "--max-model-len", "4096", "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert ngram.spec_acceptance_hint(list(range(100, 400))) is None  # engine default applies
    assert ngram.spec_acceptance_hint([7, 8, 9, 10] * 50) > 0.9
    plain = build_server(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct",
                         serve_args=["--max-model-len", "4096"])
    assert plain.spec_acceptance_hint([7, 8, 9, 10] * 50) is None
