"""Variant files: every shipped variant loads, means the same to the simulator's flag parser, and
bad files are refused with the file, the line, the field and what is allowed."""
from __future__ import annotations

import shutil

import pytest

from servelab.specs.serve_args import parse_serve_args
from servelab.specs.variants import VariantError, list_variants, load_all, load_variant

SHIPPED = {"bf16", "fp8", "gptq_int4", "awq_int4", "spec_draft", "spec_ngram", "tp2", "dp2",
           "two_instances", "tuned"}


def test_every_required_variant_ships_and_loads():
    assert SHIPPED <= set(list_variants())
    for v in load_all():
        assert v.gpus == v.tensor_parallel_size * v.data_parallel_size * v.instances
        # The simulator parses the same arguments (in vLLM's spelling, which the kind translates
        # its own into); they must mean the same thing there.
        sim = parse_serve_args(v.kind.engine_serve_args(v.serve_args))
        assert sim.tensor_parallel_size == v.tensor_parallel_size
        assert sim.data_parallel_size == v.data_parallel_size
        assert sim.quantization == v.quantization
        assert sim.speculative_config == v.speculative_config


def test_variant_details():
    fp8 = load_variant("fp8")
    assert fp8.quantization == "fp8" and fp8.claims.activations == "fp8"
    assert fp8.claims.min_compute_capability == 8.9
    assert load_variant("gptq_int4").model == "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"
    assert load_variant("awq_int4").model == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    draft = load_variant("spec_draft")
    assert draft.speculative_config == {"method": "draft_model",
                                        "model": "Qwen/Qwen2.5-0.5B-Instruct",
                                        "num_speculative_tokens": 5}
    assert draft.draft_model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert load_variant("spec_ngram").claims.speculative == "ngram"
    assert load_variant("tp2").tensor_parallel_size == 2
    assert load_variant("dp2").data_parallel_size == 2
    two = load_variant("two_instances")
    assert (two.instances, two.gpus, two.gpus_per_instance) == (2, 2, 1)
    tuned = load_variant("tuned")
    assert tuned.arg("--max-num-seqs") == "128" and tuned.arg("--gpu-memory-utilization") == "0.95"
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization"):
        assert flag in tuned.notes  # each tuned flag is documented in the file
    assert fp8.vllm_serve_args(port=8123)[:1] == ["Qwen/Qwen2.5-7B-Instruct"]
    assert fp8.vllm_serve_args(port=8123)[-2:] == ["--port", "8123"]


def test_model_is_overridable_by_environment():
    v = load_variant("fp8", environ={"SERVELAB_MODEL": "meta-llama/Llama-3.1-8B-Instruct"})
    assert v.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert v.default_model == "Qwen/Qwen2.5-7B-Instruct"
    assert load_variant("gptq_int4", environ={"SERVELAB_MODEL": "x/y"}).model.endswith("GPTQ-Int4")
    assert load_variant("fp8", environ={}).model == "Qwen/Qwen2.5-7B-Instruct"


def test_unknown_variant_lists_the_known_ones():
    with pytest.raises(VariantError) as err:
        load_variant("fp4")
    assert "unknown variant 'fp4'" in str(err.value) and "bf16" in str(err.value)


def _write(tmp_path, name, text):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


GOOD = """\
name: {name}
description: test variant
model: Qwen/Qwen2.5-7B-Instruct
serve_args: {args}
gpus: {gpus}
claims: {{weights: {weights}, activations: {acts}, min_compute_capability: {cc}, speculative: {spec}}}
"""


def _variant(tmp_path, name="t", args='["--max-model-len", "4096"]', gpus=1, weights="bf16",
             acts="bf16", cc=8.0, spec="null", extra=""):
    return _write(tmp_path, name, GOOD.format(name=name, args=args, gpus=gpus, weights=weights,
                                              acts=acts, cc=cc, spec=spec) + extra)


def test_a_valid_file_by_path(tmp_path):
    v = load_variant(_variant(tmp_path))
    assert v.name == "t" and v.max_model_len == 4096


@pytest.mark.parametrize("kwargs, line, field, words", [
    ({"extra": "colour: red\n"}, 7, "colour", "allowed one of name, description"),
    ({"gpus": 2}, 5, "gpus", "allowed 1 = tensor x pipeline x data parallel size"),
    ({"args": "['--tensor-parallel-size', 'two']"}, 4, "serve_args[0]", "a whole number"),
    ({"args": "['--port', '9000']"}, 4, "serve_args[0]", "servelab sets where the server listens"),
    ({"args": "['--quantization', 'fp4']"}, 4, "serve_args[0]", "one of fp8"),
    ({"args": "['--speculative-config', '{not json']"}, 4, "serve_args[0]", "JSON"),
    ({"args": """['--speculative-config', '{"method": "ngram", "num_speculative_tokens": 3}']"""},
     6, "claims.speculative", "'ngram', the method in --speculative-config"),
    ({"weights": "fp8", "acts": "fp8", "cc": 8.0, "args": "['--quantization', 'fp8']"},
     6, "claims.min_compute_capability", ">= 8.9"),
    ({"weights": "int3"}, 6, "claims.weights", "one of bf16, fp16, fp8, int8, int4"),
    ({"args": "['Qwen/Qwen2.5-7B-Instruct']"}, 4, "serve_args[0]", "the model goes in `model`"),
    ({"extra": "server: tgi\n"}, 7, "server", "allowed one of vllm"),
])
def test_bad_files_name_file_line_field_and_fix(tmp_path, kwargs, line, field, words):
    path = _variant(tmp_path, **kwargs)
    with pytest.raises(VariantError) as err:
        load_variant(path)
    message = str(err.value)
    assert f"{path}:{line}: {field}: found" in message, message
    assert words in message, message


def test_the_server_kind_defaults_to_vllm_and_drives_the_command_line(tmp_path):
    default = load_variant(_variant(tmp_path))
    explicit = load_variant(_variant(tmp_path, name="x", extra="server: vllm\n"))
    assert default.server == explicit.server == "vllm"
    assert default.kind.command == ("vllm", "serve")
    assert explicit.server_args(port=9) == ["Qwen/Qwen2.5-7B-Instruct", "--max-model-len",
                                            "4096", "--port", "9"]
    assert default.memory_utilization == 0.92  # vLLM 0.26 default (captured start-up log)
    assert load_variant("tuned").memory_utilization == 0.95
    # The shipped variants are vLLM's and SGLang's; the metric names the views read are the kind's.
    assert {v.server for v in load_all()} == {"vllm", "sglang"}
    assert default.kind.metrics["running"] == "vllm:num_requests_running"


def test_name_must_match_the_file_and_yaml_errors_say_where(tmp_path):
    path = _variant(tmp_path, name="other")
    shutil.move(path, tmp_path / "mine.yaml")
    with pytest.raises(VariantError, match=r"mine.yaml:1: name: found 'other'; allowed 'mine'"):
        load_variant(tmp_path / "mine.yaml")
    bad = _write(tmp_path, "broken", "name: broken\nserve_args: [\"--x\"\n")
    with pytest.raises(VariantError, match=r"broken.yaml:\d+: not valid YAML"):
        load_variant(bad)


def test_variants_command(cli):
    code, out, _ = cli("variants")
    assert code == 0 and {line.split()[0] for line in out.splitlines()} >= SHIPPED
    code, out, _ = cli("variants", "spec_draft")
    assert code == 0
    assert ("vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 8192 --speculative-config "
            "'{\"method\": \"draft_model\"") in out
    code, _, err = cli("variants", "nope")
    assert code == 2 and "unknown variant 'nope'" in err
