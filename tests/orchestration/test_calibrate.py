"""``servelab calibrate`` against a real simulator process over real sockets: the simulator runs
with cost coefficients moved from the defaults by known factors (a calibration file it finds
through SERVELAB_CALIBRATION_DIR), and the fit must find those factors again from the probes."""
from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import yaml

from servelab.core.errors import ServelabError
from servelab.core.procs import spawn
from servelab.sim.engine.costs import resolve_cost
from servelab.specs.cost_calibration import CostParams, find_calibration, load_calibration
from servelab.specs.engine_config import build_engine_config

from .conftest import REPO

# Every fitted coefficient moved by its own factor, so a swap between two would show.
FACTORS = {"eta_bw": 0.8, "eta_compute": 1.2, "eta_attn": 0.7, "t_cpu_s": 2.0, "t_seq_s": 1.5}
# The simulator's steps run on an exact engine clock (lag does not move its timestamps), so the
# only error left is a probe request arriving after the blocker's step: 2% allows for that.
TOLERANCE = 0.02
SCOPE = {"kernel_path": "bf16", "tensor_parallel_size": 1, "kv_cache_dtype": "auto",
         "enforce_eager": False, "speculative": "none"}


def _calibration(path, params: dict, **over) -> None:
    doc = {"format": "servelab-calibration/1", "variant": "calib_bf16", "hardware": "H200",
           "model": "Qwen/Qwen2.5-7B-Instruct", "source": "perturbed", "applies_to": SCOPE,
           "params": params, **over}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_calibrate_recovers_known_coefficients(tmp_path, cli, monkeypatch):
    base = CostParams()
    truth = {k: getattr(base, k) * f for k, f in FACTORS.items()}
    sim_dir = tmp_path / "sim_calibration"
    sim_dir.mkdir()
    _calibration(sim_dir / "H200-perturbed.yaml", truth)
    # The captured real vLLM runs used a 4,096-token context; so do the probes here.
    variant = tmp_path / "calib_bf16.yaml"
    variant.write_text("name: calib_bf16\nmodel: Qwen/Qwen2.5-7B-Instruct\n"
                       "description: BF16 at the captured runs' 4,096-token context\n"
                       "serve_args: ['--max-model-len', '4096']\n"
                       "claims: {weights: bf16, activations: bf16, speculative: null}\n")
    ready = tmp_path / "ready"
    proc = spawn("sim", [sys.executable, "-m", "servelab.commands.sim", "--variant", str(variant),
                         "--hardware", "H200", "--port", "0", "--ready-file", str(ready),
                         "--log-stats-interval", "0"], tmp_path / "sim.log",
                 env={**os.environ, "SERVELAB_CALIBRATION_DIR": str(sim_dir)}, ready_file=ready)
    try:
        url = proc.wait_ready(30)
        out = tmp_path / "fitted.yaml"
        monkeypatch.setenv("SERVELAB_CALIBRATION_DIR", str(tmp_path / "none"))
        code, stdout, err = cli("calibrate", "--target", url, "--variant", variant,
                                "--hardware", "H200", "--out", out, "--output-tokens", "8")
    finally:
        proc.stop()
    assert code == 0, err
    fitted = load_calibration(out)
    for name, want in truth.items():
        got = getattr(fitted.params, name)
        assert abs(got / want - 1) < TOLERANCE, (name, got, want)
    doc = yaml.safe_load(out.read_text())
    assert doc["applies_to"] == SCOPE and doc["measured"]["target"] == url
    probes = {r["probe"] for r in doc["residuals"]}
    assert {"decode_b1", "decode_b16", "mixed_3x6k", "prefill_batch_16x256"} <= probes
    assert doc["fit"]["max_abs_error"] < TOLERANCE
    assert "fitted eta_bw=" in stdout


def test_bad_hardware_and_variant_are_named(cli):
    code, _, err = cli("calibrate", "--target", "http://127.0.0.1:9", "--variant", "bf16",
                       "--hardware", "H300")
    assert code == 2 and "unknown hardware 'H300'" in err and "H200" in err
    code, _, err = cli("calibrate", "--target", "http://127.0.0.1:9", "--variant", "no_such",
                       "--hardware", "H200")
    assert code == 2 and "no_such" in err


def test_published_table_file_holds_the_defaults():
    cal = load_calibration(REPO / "servers/calibration/H100-meta-llama--Llama-3.1-8B-Instruct-bf16.yaml")
    assert cal.params == CostParams() and cal.source == "published-table"
    config = build_engine_config("H100", "meta-llama/Llama-3.1-8B-Instruct", ["--max-model-len", "8192"])
    assert find_calibration(config) == cal
    fp8 = build_engine_config("H100", "meta-llama/Llama-3.1-8B-Instruct", ["--quantization", "fp8"])
    assert find_calibration(fp8) is None  # another kernel path: the defaults, said so
    assert resolve_cost(fp8)[1].startswith("built-in defaults")


def test_a_calibration_applies_only_where_it_matches(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVELAB_CALIBRATION_DIR", str(tmp_path))
    _calibration(tmp_path / "H200-x.yaml", {"eta_bw": 0.5})
    h200 = build_engine_config("H200", "Qwen/Qwen2.5-7B-Instruct", [])
    params, label = resolve_cost(h200)
    assert params == dataclasses.replace(CostParams(), eta_bw=0.5) and "H200-x.yaml" in label
    what_if = CostParams(eta_bw=0.9)  # coefficients a caller chose are not replaced
    assert resolve_cost(h200, what_if) == (what_if, "coefficients given by the caller")
    assert resolve_cost(build_engine_config("H200", "Qwen/Qwen2.5-7B-Instruct", ["-tp", "2"]))[0] \
        == CostParams()


@pytest.mark.parametrize("params, field", [({"eta_bw": 1.5}, "params.eta_bw"),
                                           ({"eta_bandwidth": 0.5}, "params.eta_bandwidth"),
                                           ({"t_cpu_s": "fast"}, "params.t_cpu_s")])
def test_bad_calibration_file_names_file_line_field(tmp_path, params, field):
    path = tmp_path / "bad.yaml"
    _calibration(path, params)
    with pytest.raises(ServelabError) as exc:
        load_calibration(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:") and field in msg and "allowed" in msg


def test_schedule_check_sees_a_late_request_and_a_shared_blocker():
    from servelab.orchestration.calibrate import Replayed, on_schedule
    from servelab.orchestration.calibrate_probes import Measured, Probe

    probe = Probe("decode_b4", "", 4, 128, 8)
    rp = Replayed([], {}, 28, [0, 1, 1, 1, 1])   # the blocker's step, then all four together
    def measured(times):
        m = Measured(probe, 4095, [[1]] * 5)
        m.first_chunk = times
        return m
    step = 0.005
    assert on_schedule(measured([0.0, 0.080, 0.0801, 0.0802, 0.0803]), rp, step)
    assert not on_schedule(measured([0.0, 0.080, 0.0801, 0.0802, 0.0862]), rp, step)  # a step late
    assert not on_schedule(measured([0.100, 0.1001, 0.1002, 0.1003, 0.1004]), rp, step)  # shared
    assert not on_schedule(measured([0.0, 0.080, None, 0.0802, 0.0803]), rp, step)  # no chunk


def test_the_h200_probe_calibrations_apply_and_hold_at_one_user():
    """The files calibrate wrote against real vLLM 0.26 on an H200 (servers/calibration/README.md)
    are the ones a matching configuration gets, and at one user they predict the captured
    `vllm bench serve` level within issue 13's 15% (bench/fidelity_gpu.py prints every level)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import fidelity_gpu

    for variant, flags in fidelity_gpu.FLAGS.items():
        path = REPO / f"servers/calibration/H200-Qwen--Qwen2.5-7B-Instruct-{variant}.yaml"
        cal = load_calibration(path)
        assert cal.source == "probes" and yaml.safe_load(path.read_text())["measured"][
            "server_version"] == "0.26.0"
        assert find_calibration(build_engine_config("H200", "Qwen/Qwen2.5-7B-Instruct", flags)) == cal
        real = fidelity_gpu.measured(variant, 1)
        pred = fidelity_gpu.predicted(variant, 1, real["requests"])
        for figure in ("tpot_p50", "tok_s"):
            assert abs(pred[figure] / real[figure] - 1) <= 0.15, (variant, figure, pred, real)
