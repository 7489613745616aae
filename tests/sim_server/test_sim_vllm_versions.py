"""The simulator imitates a chosen vLLM release: its /metrics carries every family that release
defines (the vendored list, extracted from the wheel), its start-up log speaks that release's
lines, and verify reads either exactly as it reads a real server's."""
import json
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servelab.core.procs import spawn
from servelab.core.timeouts import HTTP_PROBE_S, SIM_READY_S, STOP_GRACE_S
from servelab.orchestration.verify import verify
from servelab.sim.engine.kv_sizing import plan_kv_cache
from servelab.specs.server_kinds.vllm.sim_log import format_line, startup_lines
from servelab.sim.server.server import resolve_config, start_background
from servelab.specs.server_kinds.vllm import versions as vllm_versions
from servelab.specs.variants import load_variant
from sim_server_helpers import FAST, get, sse_post

REPO = Path(__file__).resolve().parents[2]
SIM = [sys.executable, "-m", "servelab.commands.sim"]


def families(url):
    status, _, body = get(url, "/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def expected(version):
    return {vllm_versions.exposed_family(n, e["type"]): e["type"]
            for n, e in vllm_versions.metric_names(version).items()}


@pytest.fixture(scope="module")
def own_sim():
    with start_background(seed=5, **FAST) as bg:
        yield bg


def test_every_family_of_the_current_release_is_on_the_page_with_its_type(own_sim):
    import asyncio

    asyncio.run(sse_post(own_sim.url, "/v1/completions", {
        "model": FAST["model"], "prompt": "The quick brown fox", "max_tokens": 8, "stream": True}))
    fam = families(own_sim.url)
    want = expected(vllm_versions.CURRENT)
    assert len(want) == 138   # 0.26's 87 families and 51 new ones (vendored list, 0.33.0 wheel)
    missing = sorted(n for n in want if n not in fam)
    assert not missing, missing
    wrong = {n: (fam[n].type, t) for n, t in want.items() if fam[n].type != t}
    assert not wrong, wrong
    # Modelled, with numbers: the cache tiers' tokens and the (absent) queue limits.
    by_source = {s.labels["source"]: s.value for s in
                 fam["vllm:prompt_tokens_cached_by_source"].samples if s.name.endswith("_total")}
    assert set(by_source) == {"device", "host", "p2p", "disk", "external_unspecified"}
    rejections = [s for s in fam["vllm:admission_rejections"].samples
                  if s.name.endswith("_total")]
    assert {s.labels["reason"] for s in rejections} == {"max_num_queued_reqs",
                                                       "max_num_queued_tokens"}
    assert all(s.value == 0 for s in rejections)
    local = {s.labels["source"]: s.value for s in fam["vllm:prompt_tokens_by_source"].samples
             if s.name.endswith("_total")}
    assert local["local_compute"] > 0
    # Declared only: a connector the simulator does not run shows no series.
    assert fam["vllm:mooncake_xfer_time_seconds"].samples == []


def test_an_older_release_shows_its_own_families_only(own_sim):
    own_sim.server.exporter.imitate("0.26.0")
    try:
        fam = families(own_sim.url)
    finally:
        own_sim.server.exporter.imitate(vllm_versions.CURRENT)
    old, new = expected("0.26.0"), expected("0.33.0")
    assert all(n in fam for n in old)
    assert not any(n in fam for n in set(new) - set(old))
    assert "vllm:admission_rejections" not in fam and "vllm:prompt_tokens_cached" in fam


def test_the_vendored_list_holds_every_family_a_real_026_server_exposed():
    # servers/captured/*/metrics_after.txt: real vLLM 0.26.0 pages from an H200 (2026-12-01).
    defined = expected("0.26.0")
    for variant in ("bf16", "fp8", "spec_ngram"):
        page = (REPO / "servers" / "captured" / variant / "metrics_after.txt").read_text()
        real = {f.name: f.type for f in text_string_to_metric_families(page)
                if f.name.startswith("vllm:") and not f.name.endswith("_created")}
        assert real and all(defined.get(n) == t for n, t in real.items()), variant
    # none removed since: each release's list holds the one before it
    names = [set(vllm_versions.metric_names(r.since)) for r in vllm_versions.RELEASES[1:]]
    assert all(a <= b for a, b in zip(names, names[1:]))


@pytest.mark.parametrize("version", ["0.26.0", "0.28.0", "0.31.0", "0.33.0"])
@pytest.mark.parametrize("variant, words", [
    ("bf16", "unquantized (torch.bfloat16)"),
    ("fp8", "native FP8 W8A8 (CutlassFP8ScaledMMLinearKernel for Fp8PerTensorOnlineLinearMethod)"),
    ("gptq_int4", "W4A16 (MacheteLinearKernel for AutoGPTQLinearMethod)"),
    ("awq_int4", "W4A16 (MacheteLinearKernel for AutoAWQMarlinLinearMethod)"),
])
def test_each_releases_log_is_verified_in_its_range(tmp_path, version, variant, words):
    config, _, _ = resolve_config("H200", None, [], variant=variant)
    lines = startup_lines(config, plan_kv_cache(config), seed=1, version=version)
    path = tmp_path / "sim.log"
    path.write_text("\n".join(format_line(line) for line in lines) + "\n")
    verdict = verify(load_variant(variant, environ={}), path)
    found = {c.name: c for c in verdict.checks}
    assert verdict.status == "verified", verdict.summary()
    assert found["precision"].detail == words
    assert found["version"].status == "ok"
    assert found["version"].detail.startswith(f"vLLM {version}+servelab.sim (range "
                                              f"[{version[:4]}")
    assert verdict.facts["kv_cache_tokens"] == plan_kv_cache(config).kv_tokens
    joined = any(", Maximum concurrency for" in line for line in lines)
    assert joined == (version != "0.26.0")   # 0.28 joined the two KV lines into one
    engine = next(line for line in lines if line.startswith("Initializing a V1 LLM engine"))
    if variant == "gptq_int4":
        assert ", quantization=auto_gptq," in engine


def test_servelab_sim_takes_the_version_flag(tmp_path):
    ready, log = tmp_path / "ready", tmp_path / "sim.log"
    child = spawn("servelab sim", SIM + [
        "--hardware", "H100", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--port", "0",
        "--ready-file", str(ready), "--log-stats-interval", "0", "--max-model-len", "2048",
        "--vllm-version", "0.26.0"], log, ready_file=ready)
    try:
        url = child.wait_ready(SIM_READY_S)
        with urllib.request.urlopen(url + "/metrics", timeout=HTTP_PROBE_S) as r:
            page = r.read().decode()
        child.send_signal(signal.SIGTERM)
        child.wait(STOP_GRACE_S)
    finally:
        child.stop()
    names = {f.name for f in text_string_to_metric_families(page)}
    assert "vllm:prompt_tokens_cached" in names and "vllm:admission_rejections" not in names
    out = log.read_text()
    assert "vLLM server version 0.26.0+servelab.sim, serving model" in out
    assert "Initializing a V1 LLM engine (v0.26.0+servelab.sim)" in out


def test_a_bad_version_is_refused_naming_the_flag():
    import subprocess

    proc = subprocess.run(SIM + ["--vllm-version", "latest"], capture_output=True, text=True,
                          timeout=SIM_READY_S)
    assert proc.returncode != 0
    assert "--vllm-version latest: not a vLLM version" in proc.stderr + proc.stdout


def test_release_rows_by_version():
    assert vllm_versions.release("0.26.0").torch == "2.11.0"
    assert vllm_versions.release("v0.29.3").since == "0.28.0"
    assert vllm_versions.release("0.33.0+servelab.sim").torch == "2.14.0"
    assert vllm_versions.release("servelab-sim-1.0").since == vllm_versions.CURRENT
    assert vllm_versions.release("0.9.2").since == "0.11.0"   # older: the oldest row's words
    assert not vllm_versions.is_known("0.34.0") and vllm_versions.is_known("0.33.1")
    h200, b200 = 139.8, 178.4
    assert vllm_versions.release("0.26.0").batched_tokens_default(b200) == 8192
    assert vllm_versions.release("0.33.0").batched_tokens_default(b200) == 16384
    assert vllm_versions.release("0.33.0").batched_tokens_default(h200) == 8192
    assert vllm_versions.release("0.33.0").batched_tokens_default(80, "NVIDIA A100-SXM4") == 2048
    assert json.loads(json.dumps(vllm_versions.metric_names("0.33.0")))   # plain data
