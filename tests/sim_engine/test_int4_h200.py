"""Issue 23: the simulator's Int4 path on Hopper against the H200 capture of 2026-12-02
(servers/captured/h200_20261202, vLLM 0.26.0, Qwen2.5-7B-Instruct's config with random weights):
vLLM's kernel choice (Machete on compute capability 9.0, Marlin on 8.x), the Machete
efficiencies bench/fit_int4_kernel.py fits, and the 1- and 16-user stages of the phases profile
predicted within 15% of what the GPTQ and AWQ servers measured."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import yaml

from servelab.sim.engine.costs import KERNEL_EFFICIENCY
from servelab.specs.engine_config import build_engine_config, w4a16_kernels
from servelab.specs.hardware import load_hardware
from servelab.specs.models import load_model, model_from_config

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "servers" / "captured" / "h200_20261202"
FLAGS = ["--max-model-len", "4096", "--kv-cache-memory-bytes", "20G"]   # each cmd.txt's
MODELS = {"gptq_int4": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
          "awq_int4": "Qwen/Qwen2.5-7B-Instruct-AWQ"}


@pytest.mark.parametrize("variant", sorted(MODELS))
@pytest.mark.parametrize("hardware, path, kernel", [
    ("H200", "w4a16-machete", "MacheteLinearKernel"),     # 9.0: what the capture's log names
    ("L40S", "w4a16-marlin", "MarlinLinearKernel"),       # 8.9
    ("A100-80G", "w4a16-marlin", "MarlinLinearKernel"),   # 8.0
])
def test_the_kernel_follows_vllms_chooser(variant, hardware, path, kernel):
    config = build_engine_config(hardware, MODELS[variant], FLAGS)
    assert config.quant.name == path and config.quant.kernel == kernel
    method = "GPTQMarlinLinearMethod" if variant == "gptq_int4" else "AWQMarlinLinearMethod"
    assert f"Using {kernel} for {method}" in config.log_lines
    if hardware == "H200":   # the real server's start-up log names the same kernel
        assert f"precision     W4A16 ({kernel} for " in (CAPTURE / variant / "verify.txt").read_text()


def test_machete_declines_what_its_can_implement_refuses():
    h200 = load_hardware("H200")
    gptq = load_model(MODELS["gptq_int4"])

    def with_quant(**changes):
        cfg = dict(gptq.config, quantization_config={**gptq.quantization_config, **changes})
        return model_from_config(gptq.hf_id, cfg, "synthesized")

    assert w4a16_kernels(h200, gptq) == ("MacheteLinearKernel",)
    assert w4a16_kernels(h200, with_quant(group_size=32)) == ("MarlinLinearKernel",)
    # act-order is fine on one GPU; with TP the row-parallel layers (o_proj, down_proj) fall back
    assert w4a16_kernels(h200, with_quant(desc_act=True)) == ("MacheteLinearKernel",)
    assert w4a16_kernels(h200, with_quant(desc_act=True), tp=2) == \
        ("MacheteLinearKernel", "MarlinLinearKernel")


def test_the_machete_entry_is_the_fit_of_the_capture():
    sys.path.insert(0, str(REPO / "bench"))
    import fit_int4_kernel

    fit = fit_int4_kernel.fit(CAPTURE)
    entry = KERNEL_EFFICIENCY["w4a16-machete"]
    assert (entry.gemm, entry.bw) == (round(fit["gemm"], 2), round(fit["bw"], 2))


def _measured(variant: str) -> dict[int, dict]:
    with open(CAPTURE / variant / f"phases_{variant}" / "stage_summary.csv") as f:
        return {int(float(r["level"])): r for r in csv.DictReader(f) if r["class_name"] == "(all)"}


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    """servelab predict of the capture's own profile, cut to its 1- and 16-user stages."""
    from servelab.analysis.views import open_results_db
    from servelab.cli import main

    tmp = tmp_path_factory.mktemp("int4_h200")
    profile = yaml.safe_load((CAPTURE / "h200_phases.yaml").read_text())
    profile["load"]["concurrency"]["levels"] = [1, 16]
    (tmp / "profile.yaml").write_text(yaml.safe_dump(profile))
    db = tmp / "p.duckdb"
    for variant in MODELS:
        spec = yaml.safe_load((REPO / "servers" / "variants" / f"{variant}.yaml").read_text())
        spec["serve_args"] = FLAGS
        spec.pop("model_env", None)
        (tmp / f"{variant}.yaml").write_text(yaml.safe_dump(spec))
        assert main(["predict", "--variant", str(tmp / f"{variant}.yaml"), "--hardware", "H200",
                     "--profile", str(tmp / "profile.yaml"), "--db", str(db)]) == 0
    con = open_results_db(db)
    rows = con.execute(
        "SELECT r.variant, st.level::INTEGER, s.output_tokens_per_s, s.tpot_p50_ms "
        "FROM stage_summary s JOIN stages st USING (run_id, stage) JOIN runs r USING (run_id) "
        "WHERE s.class_name = '(all)'").fetchall()
    con.close()
    return {(v, users): (tok_s, tpot) for v, users, tok_s, tpot in rows}


@pytest.mark.parametrize("variant", sorted(MODELS))
@pytest.mark.parametrize("users", [1, 16])
def test_int4_stages_within_15_percent_of_the_capture(predicted, variant, users):
    real = _measured(variant)[users]
    tok_s, tpot = predicted[(variant, users)]
    assert tok_s / float(real["output_tokens_per_s"]) == pytest.approx(1.0, abs=0.15)
    assert tpot / float(real["tpot_p50_ms"]) == pytest.approx(1.0, abs=0.15)
