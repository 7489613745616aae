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
from servelab.specs.cost_calibration import MECHANISMS, PARAM_NAMES, find_calibration
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
