"""A calibration made for a model id applies to a local folder holding that model's config.json
(issue 22: preflight with SERVELAB_MODEL=/folder fell back to the built-in defaults, because the
folder's path was compared with the calibration's id), and the file says what each coefficient
prices."""
from __future__ import annotations

import json
import shutil

import yaml

from servelab.core.paths import servers_dir
from servelab.sim.engine.costs import resolve_cost
from servelab.specs.cost_calibration import MECHANISMS, PARAM_NAMES, CostParams, find_calibration
from servelab.specs.engine_config import build_engine_config

FLAGS = ["--max-model-len", "4096", "--kv-cache-memory-bytes", "20G"]
QWEN = servers_dir() / "models" / "Qwen--Qwen2.5-7B-Instruct" / "config.json"


def test_local_folder_with_the_same_config_uses_the_ids_calibration(tmp_path):
    folder = tmp_path / "qwen2_5_7b"
    folder.mkdir()
    shutil.copy(QWEN, folder / "config.json")
    config = build_engine_config("H200", str(folder), FLAGS)
    assert config.model.hf_id == str(folder)
    cal = find_calibration(config)
    assert cal is not None and cal.model == "Qwen/Qwen2.5-7B-Instruct"
    assert "H200-Qwen--Qwen2.5-7B-Instruct-bf16.yaml" in resolve_cost(config)[1]


def test_a_folder_of_another_shape_keeps_the_defaults(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    cfg = json.loads(QWEN.read_text())
    cfg["num_hidden_layers"] = 12
    (folder / "config.json").write_text(json.dumps(cfg))
    assert find_calibration(build_engine_config("H200", str(folder), FLAGS)) is None


def test_shipped_h200_calibrations_name_each_coefficients_mechanism():
    for variant in ("bf16", "fp8"):
        path = servers_dir() / "calibration" / f"H200-Qwen--Qwen2.5-7B-Instruct-{variant}.yaml"
        doc = yaml.safe_load(path.read_text())
        assert set(doc["mechanisms"]) == set(doc["params"])
        assert all(doc["mechanisms"][k] == MECHANISMS[k] for k in doc["params"])
        assert {"api_server_cpu", "async_scheduling_host", "idle_fixed_cost"} <= set(
            doc["mechanisms"].values())
    assert set(MECHANISMS) == set(PARAM_NAMES)


def test_preflight_of_a_variant_served_from_a_folder_names_the_ids_calibration(tmp_path):
    """``SERVELAB_MODEL=/folder servelab preflight``: the variant's model is the folder, whose
    config.json has the id's shape, so its speed estimates use the id's calibration."""
    from servelab.orchestration.preflight import gpus_from_hardware, run_preflight
    from servelab.specs.variants import load_variant

    folder = tmp_path / "qwen2_5_7b"
    folder.mkdir()
    shutil.copy(QWEN, folder / "config.json")
    spec = tmp_path / "bf16_local.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "bf16_local", "description": "the bf16 variant served from a local folder",
        "model": "Qwen/Qwen2.5-7B-Instruct", "model_env": "SERVELAB_MODEL",
        "serve_args": FLAGS, "gpus": 1, "instances": 1,
        "claims": {"weights": "bf16", "activations": "bf16", "min_compute_capability": 8.0,
                   "speculative": None}}))
    variant = load_variant(spec, environ={"SERVELAB_MODEL": str(folder)})
    assert variant.model == str(folder)
    report = run_preflight(variant, gpus_from_hardware("H200", 1), "--hardware H200")
    said = [v.reason for v in report.verdicts if "cost model" in v.reason]
    assert said and "H200-Qwen--Qwen2.5-7B-Instruct-bf16.yaml" in said[0]


def test_shipped_h200_int4_calibrations_carry_the_engine_software_terms():
    """The Int4 files price the host side, the idle cost and the API server as the BF16 file
    does (the same vLLM on the same host) and keep the built-in GPU coefficients under which
    the Machete efficiencies were fitted."""
    bf16 = yaml.safe_load((servers_dir() / "calibration" /
                           "H200-Qwen--Qwen2.5-7B-Instruct-bf16.yaml").read_text())["params"]
    for name in ("H200-Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4-gptq_int4.yaml",
                 "H200-Qwen--Qwen2.5-7B-Instruct-AWQ-awq_int4.yaml"):
        doc = yaml.safe_load((servers_dir() / "calibration" / name).read_text())
        assert doc["mechanisms"] == {k: MECHANISMS[k] for k in doc["params"]}
        for k, v in doc["params"].items():
            if MECHANISMS[k] == "gpu_forward":
                assert v == getattr(CostParams(), k), k
            else:
                assert v == bf16[k], k


def test_a_new_probe_fit_keeps_the_recorded_runs_mechanisms():
    """The probes fit the GPU's coefficients only; re-running ``servelab calibrate`` on a scope
    whose calibration prices the host side, the idle cost and the API server from a recorded run
    keeps those, each with its mechanism."""
    from servelab.orchestration.calibrate import carry_recorded_terms

    config = build_engine_config("H200", "Qwen/Qwen2.5-7B-Instruct", FLAGS)
    doc = {"params": {"eta_bw": 0.8}, "mechanisms": {"eta_bw": "gpu_forward"}}
    carry_recorded_terms(doc, config)
    assert doc["params"]["api_chunk_s"] == 5e-5 and doc["params"]["t_idle_step_s"] > 0
    assert doc["mechanisms"]["api_chunk_s"] == "api_server_cpu"
    assert doc["mechanisms"]["t_host_s"] == "async_scheduling_host"
    assert doc["recorded_run"]["kept_from"] == "H200-Qwen--Qwen2.5-7B-Instruct-bf16.yaml"
    assert doc["params"]["eta_bw"] == 0.8
