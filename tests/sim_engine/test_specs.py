"""Specs layer: hardware files, model configs, vLLM serve flags, engine-config decisions."""
import pytest

from servelab.core.errors import ServelabError
from servelab.specs import (
    batch_defaults,
    build_engine_config,
    hardware_for_gpu_name,
    hf_id_from_dir,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
    model_dir_name,
    parse_serve_args,
)
from servelab.sim.engine.costs import default_acceptance, match_probability
from servelab.specs.engine_config import FP8_MARLIN_WARNING

KIB = 1024


def test_every_gpu_of_the_issue_has_a_file_with_sane_numbers():
    assert set(list_hardware()) >= {"A10G", "L4", "L40S", "A100-80G", "H100", "H200"}
    for name in list_hardware():
        hw = load_hardware(name)
        assert 20 < hw.memory_gib < 150
        assert hw.memory_gib <= hw.memory_gb  # nvidia-smi MiB never exceed the marketing size
        assert hw.tflops_bf16 > 0 and hw.bandwidth_gb_s > 0
        assert hw.link_type in ("nvlink", "pcie")
    assert load_hardware("a10g").native_fp8 is False
    assert load_hardware("A100-80G").tflops_fp8 is None
    assert load_hardware("L40S").native_fp8 and load_hardware("H100").native_fp8
    assert load_hardware("H200").memory_gib > 130


def test_nvidia_smi_names_map_to_files():
    assert hardware_for_gpu_name("NVIDIA L40S").name == "L40S"
    assert hardware_for_gpu_name("NVIDIA A10G").name == "A10G"
    assert hardware_for_gpu_name("NVIDIA H100 80GB HBM3").name == "H100"
    assert hardware_for_gpu_name("NVIDIA A100-SXM4-80GB").name == "A100-80G"
    assert hardware_for_gpu_name("NVIDIA GeForce RTX 4090") is None
    assert load_hardware("NVIDIA L4").name == "L4"


def test_unknown_hardware_lists_known_ones():
    with pytest.raises(ServelabError, match="known: .*H100.*L40S"):
        load_hardware("TPUv5")


@pytest.mark.parametrize("edit,where", [
    (("memory_gb: 80", "memory_gb: lots"), ":{line}: memory_gb: found 'lots'; write a positive number"),
    (("  bf16: 989", "  bf16: -1"), ":{line}: tflops_dense.bf16: found -1; write a positive number"),
    (("compute_capability: \"9.0\"", "compute_capability: nine"),
     ":{line}: compute_capability: found 'nine'; write it like \"8.9\""),
    (("memory_mib: 81559", "# memory_mib: 81559"), ": memory_mib: missing; add it"),
    (("memory_gb: 80", "memory_gb: 80\nmemory_gb: 81"), ":{line2}: memory_gb: given twice"),
    (("  type: nvlink", "  type: infiniband"), ":{line}: interconnect.type: found 'infiniband'"),
    (("memory_gb: 80", "memory_gb: [80"), ": not valid YAML"),
])
def test_a_bad_hardware_file_names_its_line_and_field(tmp_path, edit, where):
    from servelab.specs.hardware import hardware_dir, read_hardware_file
    text = (hardware_dir() / "H100.yaml").read_text()
    old, new = edit
    assert old in text, old
    bad = tmp_path / "H100.yaml"
    bad.write_text(text.replace(old, new, 1))
    lines = bad.read_text().splitlines()
    key = old.split(":")[0]
    at = [i + 1 for i, ln in enumerate(lines) if ln.startswith(key) or ln.strip().startswith(key.strip())]
    with pytest.raises(ServelabError) as got:
        read_hardware_file(bad)
    message = str(got.value)
    assert message.startswith(str(bad)), message
    assert where.format(line=at[0] if at else 1, line2=at[-1] if at else 1) in message, message


def test_model_ids_map_to_directories_both_ways():
    assert model_dir_name("Qwen/Qwen2.5-7B-Instruct") == "Qwen--Qwen2.5-7B-Instruct"
    assert hf_id_from_dir("meta-llama--Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    known = list_models()
    for hf in ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-14B",
               "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
               "Qwen/Qwen2.5-7B-Instruct-AWQ", "Qwen/Qwen3-14B-AWQ"):
        assert hf in known
    assert load_model("qwen3-14b-awq").hf_id == "Qwen/Qwen3-14B-AWQ"
    assert load_model("Qwen--Qwen3-14B").hf_id == "Qwen/Qwen3-14B"


def test_unknown_model_lists_known_ones():
    with pytest.raises(ServelabError, match=r"unknown model 'org/nope'; known: .*Qwen/Qwen3-14B"):
        load_model("org/nope")


def test_model_shapes_match_published_parameter_counts():
    llama = load_model("meta-llama/Llama-3.1-8B-Instruct")
    assert llama.linear_params / 1e9 == pytest.approx(6.98, abs=0.01)
    assert llama.lm_head_params / 1e9 == pytest.approx(0.525, abs=0.001)
    assert llama.total_params / 1e9 == pytest.approx(8.03, abs=0.01)
    assert llama.kv_bytes_per_token() == 128 * KIB
    assert llama.kv_bytes_per_token(kv_dtype_bytes=1) == 64 * KIB
    assert llama.kv_bytes_per_token(tp=2) == 64 * KIB
    qwen = load_model("Qwen/Qwen2.5-7B-Instruct")
    assert qwen.kv_bytes_per_token() == 56 * KIB
    assert qwen.total_params / 1e9 == pytest.approx(7.62, abs=0.01)
    assert load_model("Qwen/Qwen3-14B").total_params / 1e9 == pytest.approx(14.77, abs=0.03)
    small = load_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert small.tie_word_embeddings and small.total_params / 1e9 == pytest.approx(0.494, abs=0.01)
    assert load_model("Qwen/Qwen3-14B-AWQ").quantization_config["quant_method"] == "awq"
    gptq = load_model("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4").quantization_config
    assert (gptq["quant_method"], gptq["bits"], gptq["group_size"]) == ("gptq", 4, 128)


def test_serve_args_as_vllm_spells_them():
    a = parse_serve_args([
        "--quantization", "fp8", "-tp", "2", "--data-parallel-size=2", "--max-num-seqs", "64",
        "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.85", "--max-model-len", "16k",
        "--no-enable-prefix-caching", "--served-model-name", "qwen", "alias", "--kv-cache-dtype", "fp8",
        "--block-size", "32", "--speculative-config", '{"method":"ngram","num_speculative_tokens":4}',
        "--host", "0.0.0.0", "--port", "8001", "--trust-remote-code", "--enforce-eager",
    ])
    assert a.quantization == "fp8" and a.tensor_parallel_size == 2 and a.data_parallel_size == 2
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len) == (64, 4096, 16000)
    assert a.gpu_memory_utilization == 0.85 and a.enable_prefix_caching is False
    assert a.served_model_name == ["qwen", "alias"] and a.kv_cache_dtype == "fp8" and a.block_size == 32
    assert a.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert a.enforce_eager
    assert a.ignored == ["--host=0.0.0.0", "--port=8001", "--trust-remote-code"]
    assert parse_serve_args(["--enable-prefix-caching"]).enable_prefix_caching
    assert parse_serve_args([]).max_num_seqs is None


@pytest.mark.parametrize("argv, message", [
    (["--pipeline-parallel-size", "2"], "not simulated"),
    (["--max-num-seqs", "lots"], "--max-num-seqs: found 'lots'"),
    (["--gpu-memory-utilization", "1.5"], r"allowed \(0, 1\]"),
    (["--speculative-config", "{method: ngram}"], "not valid JSON"),
    (["--quantization", "int3"], "allowed fp8, awq"),
    (["--max-num-seqs"], "needs a value"),
    (["--swap-spaces", "4"], "unknown or unsimulated vLLM flag '--swap-spaces'"),
])
def test_bad_serve_args_name_the_flag(argv, message):
    with pytest.raises(ServelabError, match=message):
        parse_serve_args(argv)


def test_batch_defaults_follow_vllm_per_gpu_class():
    assert batch_defaults(load_hardware("H100")) == (8192, 1024)
    assert batch_defaults(load_hardware("H200")) == (8192, 1024)
    assert batch_defaults(load_hardware("A100-80G")) == (2048, 256)  # the "a100" exception
    assert batch_defaults(load_hardware("L40S")) == (2048, 256)
    cfg = build_engine_config("H100", "meta-llama/Llama-3.1-8B-Instruct", [])
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len) == (8192, 1024, 131072)
    cfg = build_engine_config("L4", "Qwen/Qwen2.5-7B-Instruct", ["--max-num-seqs", "32"])
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len) == (2048, 32, 32768)
    assert cfg.served_model_name == "Qwen/Qwen2.5-7B-Instruct"


def test_quantization_paths_and_their_log_lines():
    fp8_a10g = build_engine_config("A10G", "Qwen/Qwen2.5-7B-Instruct", ["--quantization", "fp8"])
    assert fp8_a10g.quant.name == "fp8-w8a16-marlin"
    assert FP8_MARLIN_WARNING in fp8_a10g.warnings
    assert any("MarlinFP8ScaledMMLinearKernel" in line for line in fp8_a10g.log_lines)
    fp8_l40s = build_engine_config("L40S", "Qwen/Qwen2.5-7B-Instruct", ["--quantization", "fp8"])
    assert fp8_l40s.quant.name == "fp8-w8a8" and not fp8_l40s.warnings
    assert fp8_l40s.quant.gemm_tflops == 733
    gptq = build_engine_config("L40S", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", [])
    assert gptq.quant.name == "w4a16-marlin"
    assert "The model is convertible to gptq_marlin during runtime. Using gptq_marlin kernel." in gptq.log_lines
    forced = build_engine_config("L40S", "Qwen/Qwen3-14B-AWQ", ["--quantization", "awq"])
    assert forced.quant.name == "awq-gemm"
    assert any(line.startswith("Detected that the model can run with awq_marlin, however you specified "
                               "quantization=awq explicitly, so forcing awq.") for line in forced.log_lines)
    assert build_engine_config("H100", "Qwen/Qwen3-14B-FP8", []).quant.name == "fp8-w8a8"
    assert build_engine_config("A100-80G", "Qwen/Qwen3-14B-FP8", []).quant.name == "fp8-w8a16-marlin"
    with pytest.raises(ServelabError, match=r"model config \(gptq\) does not match .* argument \(fp8\)"):
        build_engine_config("L40S", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", ["--quantization", "fp8"])
    with pytest.raises(ServelabError, match="Cannot find the config file for awq"):
        build_engine_config("L40S", "Qwen/Qwen2.5-7B-Instruct", ["--quantization", "awq"])


def test_tp_over_pcie_warns_and_bad_tp_is_refused():
    cfg = build_engine_config("L4", "Qwen/Qwen2.5-7B-Instruct", ["-tp", "2"])
    assert any("Custom allreduce is disabled" in w for w in cfg.warnings) and not cfg.custom_all_reduce
    assert build_engine_config("H100", "Qwen/Qwen2.5-7B-Instruct", ["-tp", "2"]).custom_all_reduce
    with pytest.raises(ServelabError, match=r"attention heads \(28\) must be divisible by tensor parallel size \(3\)"):
        build_engine_config("H100", "Qwen/Qwen2.5-7B-Instruct", ["-tp", "3"])
    with pytest.raises(ServelabError, match="greater than the derived max_model_len"):
        build_engine_config("H100", "Qwen/Qwen2.5-7B-Instruct", ["--max-model-len", "65536"])


def test_speculative_configs():
    draft = build_engine_config("L4", "Qwen/Qwen2.5-7B-Instruct", [
        "--speculative-config", '{"method":"draft_model","model":"Qwen/Qwen2.5-0.5B-Instruct","num_speculative_tokens":5}'])
    assert draft.speculative.draft.hf_id == "Qwen/Qwen2.5-0.5B-Instruct"
    rates = default_acceptance(draft.speculative.method, draft.num_speculative_tokens)
    assert draft.num_speculative_tokens == 5 and len(rates) == 5
    assert list(rates) == sorted(rates, reverse=True)
    eagle = build_engine_config("H100", "meta-llama/Llama-3.1-8B-Instruct", [
        "--speculative-config", '{"model":"RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3","num_speculative_tokens":3}'])
    assert eagle.speculative.method == "eagle3" and eagle.speculative.draft.num_layers == 1
    ngram = build_engine_config("H100", "Qwen/Qwen2.5-7B-Instruct", [
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'])
    assert ngram.speculative.draft is None and 0 < match_probability(ngram.speculative.method) < 1
    with pytest.raises(ServelabError, match="num_speculative_tokens"):
        build_engine_config("H100", "Qwen/Qwen2.5-7B-Instruct", ["--speculative-config", '{"method":"ngram"}'])
    with pytest.raises(ServelabError, match="unknown model"):
        build_engine_config("H100", "Qwen/Qwen2.5-7B-Instruct", [
            "--speculative-config", '{"method":"draft_model","model":"x/y","num_speculative_tokens":2}'])
