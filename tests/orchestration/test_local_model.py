"""A variant served from a local model folder (how GPU hosts without internet serve): preflight,
predict, the simulator, verify and the matrix read the folder's own config.json, and the served
model name is the path, as `vllm serve /path` names it."""
from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from servelab.core.errors import ServelabError
from servelab.orchestration import backends
from servelab.orchestration.gpus import read_gpus
from servelab.orchestration.preflight import run_preflight
from servelab.orchestration.verify import verify
from servelab.specs.models import load_model
from servelab.specs.variants import VariantError, load_variant

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "servers" / "models" / "Qwen--Qwen2.5-7B-Instruct" / "config.json"
DATA = Path(__file__).resolve().parent / "data"
VARIANT = """name: {name}
description: BF16 from a local folder
model: {model}
model_env: SERVELAB_MODEL
serve_args: ['--max-model-len', '4096']
gpus: 1
claims: {{weights: bf16, activations: bf16, min_compute_capability: 8.0, speculative: null}}
"""


@pytest.fixture
def folder(tmp_path) -> Path:
    path = tmp_path / "models" / "qwen2_5_7b"
    path.mkdir(parents=True)
    shutil.copy(CONFIG, path / "config.json")
    return path


def _variant_file(tmp_path: Path, model: str, name: str = "local_bf16") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(VARIANT.format(name=name, model=model))
    return path


def test_a_folder_reads_its_own_config_and_is_named_by_its_path(folder):
    spec = load_model(str(folder))
    assert spec.hf_id == str(folder)
    assert spec.config == json.loads(CONFIG.read_text())
    assert spec.kv_bytes_per_token() == load_model("Qwen/Qwen2.5-7B-Instruct").kv_bytes_per_token()
    assert spec.short_name == "qwen2_5_7b"


def test_a_folder_without_config_json_says_which_folder_and_the_fix(tmp_path):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    with pytest.raises(ServelabError, match=rf"{empty}/config.json is missing; .*copy it there"):
        load_model(str(empty))
    with pytest.raises(ServelabError, match="no such folder"):
        load_model(str(tmp_path / "nowhere"))


def test_preflight_on_a_folder_and_on_an_id_overridden_by_a_folder(tmp_path, folder):
    gpus = read_gpus(REPO / "servers" / "gpus" / "l40s.csv")
    by_id = run_preflight(load_variant(_variant_file(tmp_path, "Qwen/Qwen2.5-7B-Instruct", "by_id"),
                                       environ={}), gpus, "l40s.csv")
    by_path = run_preflight(load_variant(_variant_file(tmp_path, str(folder)), environ={}),
                            gpus, "l40s.csv")
    overridden = load_variant(_variant_file(tmp_path, "Qwen/Qwen2.5-7B-Instruct", "by_env"),
                              environ={"SERVELAB_MODEL": str(folder)})
    assert overridden.model == str(folder)
    by_env = run_preflight(overridden, gpus, "l40s.csv")
    assert by_path.model == by_env.model == str(folder)
    assert by_id.kv_tokens == by_path.kv_tokens == by_env.kv_tokens > 0
    assert by_path.status == "ok", by_path.render()
    broken = load_variant(_variant_file(tmp_path, "Qwen/Qwen2.5-7B-Instruct", "broken"),
                          environ={"SERVELAB_MODEL": str(tmp_path)})
    with pytest.raises(ServelabError, match="config.json is missing"):
        run_preflight(broken, gpus, "l40s.csv")


def test_a_variant_file_refuses_a_model_that_is_neither_id_nor_path(tmp_path):
    with pytest.raises(VariantError, match="a local model folder such as"):
        load_variant(_variant_file(tmp_path, "just-a-name"))


def test_predict_on_a_folder(tmp_path, folder, cli):
    variant = _variant_file(tmp_path, str(folder))
    db = tmp_path / "p.duckdb"
    code, out, err = cli("predict", "--variant", variant, "--hardware", "L40S", "--profile",
                         DATA / "tiny.yaml", "--db", db)
    assert code == 0, err
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT model FROM runs").fetchone()[0] == str(folder)
    con.close()


@pytest.mark.slow
def test_the_simulator_serves_a_folder_under_its_path_and_verify_holds(tmp_path, folder):
    variant = load_variant(_variant_file(tmp_path, str(folder)), environ={})
    server = backends.start_server("sim", variant, tmp_path / "logs", hardware="L40S")
    try:
        backends.wait_healthy(server, 30)
        with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as resp:
            ids = [m["id"] for m in json.loads(resp.read())["data"]]
        assert ids == [str(folder)]
        verdict = verify(variant, log_path=server.log_path, url=server.url)
        assert verdict.status == "verified", verdict.summary()
    finally:
        server.stop()


@pytest.mark.slow
def test_matrix_backend_local_and_sim_on_a_folder(tmp_path, folder, stand_in, cli):
    stand_in("vllm", stand_in.vllm_to_sim)
    variant = _variant_file(tmp_path, str(folder))
    for backend in ("local", "sim"):
        db = tmp_path / f"{backend}.duckdb"
        code, out, err = cli("matrix", "--variants", variant, "--profile", DATA / "matrix_tiny.yaml",
                             "--backend", backend, "--hardware", "L40S", "--gpus",
                             REPO / "servers" / "gpus" / "l40s.csv", "--db", db, "--logs",
                             tmp_path / f"logs_{backend}", "--no-report")
        assert code == 0, out + err
        import duckdb
        con = duckdb.connect(str(db), read_only=True)
        status, model = con.execute("SELECT verification->>'status', model FROM runs").fetchone()
        con.close()
        assert status == "verified" and model == str(folder)
