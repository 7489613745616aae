"""Preflight on saved nvidia-smi outputs (L40S, A10G, L4, H100, and a real 2x H200 capture)."""
from __future__ import annotations

from pathlib import Path

import pytest

from servelab.core.errors import ServelabError
from servelab.orchestration.gpus import parse_gpu_csv, parse_topology, read_gpus
from servelab.orchestration.preflight import run_preflight
from servelab.specs.variants import load_variant

REPO = Path(__file__).resolve().parents[2]
GPUS = REPO / "servers" / "gpus"
TINY = Path(__file__).resolve().parent / "data" / "tiny.yaml"
DATA_PEAK = Path(__file__).resolve().parent / "data" / "peak.yaml"


@pytest.mark.parametrize("file, name, cc, total", [
    ("l40s.csv", "NVIDIA L40S", (8, 9), 46068),
    ("a10g.csv", "NVIDIA A10G", (8, 6), 23028),
    ("l4.csv", "NVIDIA L4", (8, 9), 23034),
    ("h100.csv", "NVIDIA H100 80GB HBM3", (9, 0), 81559),
    ("h200_x2.csv", "NVIDIA H200", (9, 0), 143771),
])
def test_saved_nvidia_smi_outputs_parse(file, name, cc, total):
    text = (GPUS / file).read_text()
    assert text.splitlines()[0] == "index, name, compute_cap, memory.total [MiB], memory.used [MiB]"
    gpus = read_gpus(GPUS / file)
    assert gpus[0].name == name and gpus[0].compute_capability == cc
    assert gpus[0].memory_total_mib == total


def test_topology_outputs():
    h200 = parse_topology((GPUS / "h200_x2_topo.txt").read_text())  # real capture, ANSI codes kept
    assert h200 == {(0, 1): "NV18", (1, 0): "NV18"}
    l4 = parse_topology((GPUS / "l4_x4_topo.txt").read_text())
    assert l4[(0, 3)] == "PHB" and len(l4) == 12


def test_malformed_csv_names_file_line_and_field(tmp_path):
    bad = tmp_path / "gpus.csv"
    bad.write_text("index, name, compute_cap, memory.total [MiB], memory.used [MiB]\n"
                   "0, NVIDIA L4, 8.9, 23034, 0 MiB\n")
    with pytest.raises(ServelabError, match=r"gpus.csv:2: memory.total: found '23034'"):
        read_gpus(bad)
    with pytest.raises(ServelabError, match="expected the columns index, name, compute_cap"):
        parse_gpu_csv("index, name, memory.total [MiB]\n0, X, 1 MiB\n", "x.csv")
    with pytest.raises(ServelabError, match="no such file"):
        read_gpus(tmp_path / "missing.csv")
    # Without the header (--format=csv,noheader) the rows still parse.
    assert parse_gpu_csv("0, NVIDIA L4, 8.9, 23034 MiB, 0 MiB\n")[0].cc_number == 89


def test_fp8_on_a10g_is_refused_with_the_reason(cli):
    code, out, _ = cli("preflight", "fp8", "--gpus", GPUS / "a10g.csv")
    assert code == 1
    assert "REFUSE" in out and "compute capability >= 8.9" in out and "8.6" in out
    assert "W8A16" in out and "Marlin" in out
    assert "fp8-w8a16-marlin" in out  # what vLLM would really run


@pytest.mark.parametrize("file", ["l40s.csv", "l4.csv", "h100.csv"])
def test_fp8_runs_natively_at_cc_8_9_and_above(cli, file):
    code, out, _ = cli("preflight", "fp8", "--gpus", GPUS / file)
    assert code == 0, out
    assert "fp8-w8a8" in out and "result: OK" in out


def test_memory_figures_come_from_the_engine_sizing(cli):
    from servelab.sim.engine.kv_sizing import preflight as engine_preflight

    variant = load_variant("bf16")
    report = run_preflight(variant, read_gpus(GPUS / "l40s.csv"), "l40s.csv")
    plan = engine_preflight("L40S", variant.model, list(variant.serve_args))
    assert report.kv_tokens == plan.kv_tokens and report.weights_gib == plan.weights_gib
    # Qwen2.5-7B: 28 layers x 4 KV heads x 128 dims x K and V x 2 bytes = 56 KiB per token.
    assert report.kv_bytes_per_token == 57344
    assert report.max_concurrency == pytest.approx(plan.kv_tokens / 8192, rel=0.01)
    code, out, _ = cli("preflight", "bf16", "--gpus", GPUS / "l40s.csv")
    assert code == 0
    for words in ("weights           14.", "KV bytes/token    56.0 KiB", f"{plan.kv_tokens:,} tokens",
                  "max concurrency"):
        assert words in out


def test_profile_lengths_give_the_concurrency_at_the_profile(cli):
    code, out, _ = cli("preflight", "gptq_int4", "--gpus", GPUS / "l4.csv", "--profile", TINY)
    assert code == 0
    assert "at the profile" in out and "mean prompt+output of tiny" in out
    assert "the profile peaks at 4" in out


def test_not_enough_memory_is_refused(tmp_path, cli):
    big = tmp_path / "big14b.yaml"
    big.write_text("name: big14b\ndescription: a 14B model in BF16\nmodel: Qwen/Qwen3-14B\n"
                   "serve_args: ['--max-model-len', '8192']\ngpus: 1\n"
                   "claims: {weights: bf16, activations: bf16, min_compute_capability: 8.0, "
                   "speculative: null}\n")
    code, out, _ = cli("preflight", big, "--gpus", GPUS / "l4.csv")
    assert code == 1 and "not enough memory" in out
    # The same model fits an H100.
    assert cli("preflight", big, "--gpus", GPUS / "h100.csv")[0] == 0


def test_memory_already_in_use_is_refused(tmp_path, cli):
    busy = tmp_path / "busy.csv"
    busy.write_text("index, name, compute_cap, memory.total [MiB], memory.used [MiB]\n"
                    "0, NVIDIA L40S, 8.9, 46068 MiB, 20480 MiB\n")
    code, out, _ = cli("preflight", "bf16", "--gpus", busy)
    assert code == 1 and "20,480 MiB in use" in out


def test_more_gpus_than_present_is_refused(cli):
    code, out, _ = cli("preflight", "tp2", "--gpus", GPUS / "l40s.csv")
    assert code == 1 and "needs 2 GPUs" in out and "lists 1" in out
    assert cli("preflight", "two_instances", "--gpus", GPUS / "h100.csv")[0] == 1


def test_tp_without_nvlink_warns_and_strict_makes_it_an_error(cli):
    args = ("preflight", "tp2", "--gpus", GPUS / "l4_x4.csv", "--topology", GPUS / "l4_x4_topo.txt")
    code, out, _ = cli(*args)
    assert code == 0 and "WARN" in out and "without NVLink" in out and "result: WARN" in out
    assert cli(*args, "--strict")[0] == 1
    # Over NVLink (a real 2x H200 topology) there is nothing to warn about.
    code, out, _ = cli("preflight", "tp2", "--gpus", GPUS / "h200_x2.csv",
                       "--topology", GPUS / "h200_x2_topo.txt")
    assert code == 0 and "result: OK" in out
    # Without a topology file the hardware spec decides: L4 has no NVLink, H100 SXM has.
    assert "without NVLink" in cli("preflight", "tp2", "--hardware", "L4")[1]
    assert "result: OK" in cli("preflight", "tp2", "--gpus", GPUS / "h100_x2.csv")[1]
    # Data parallelism does not all-reduce: no warning.
    assert "result: OK" in cli("preflight", "dp2", "--gpus", GPUS / "l4_x4.csv")[1]


def test_bad_input_exits_2(cli):
    code, _, err = cli("preflight", "fp8", "--gpus", "/nonexistent.csv")
    assert code == 2 and "no such file" in err


def test_without_nvidia_smi_the_error_says_what_to_give(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a host with no NVIDIA driver
    code, _, err = cli("preflight", "bf16")
    assert code == 2 and "nvidia-smi not found" in err and "--gpus FILE" in err


def test_profile_peak_beyond_kv_capacity_and_max_num_seqs_warns(cli):
    code, out, _ = cli("preflight", "bf16", "--hardware", "A10G", "--profile", DATA_PEAK)
    assert code == 0 and "result: WARN" in out
    assert "goes up to 300 concurrent requests, but the KV cache holds about" in out
    assert "max-num-seqs 256 caps the batch" in out
    assert "longer than max-model-len 8,192" in out
    # On an H100 the KV cache holds the peak; the batch cap and the long requests remain.
    code, out, _ = cli("preflight", "bf16", "--hardware", "H100", "--profile", DATA_PEAK)
    assert "but the KV cache holds" not in out and "longer than max-model-len" in out


# ---- real captures from one H200 (servers/captured/gpu) and what users paste --------------------
CAPTURED = REPO / "servers" / "captured"


def test_captured_query_with_extra_columns_and_the_plain_table_parse():
    gpu = CAPTURED / "gpu"
    # --query-gpu=name,compute_cap,memory.total,memory.used,memory.free,driver_version (no index)
    assert read_gpus(gpu / "nvidia-smi_query_server_up_bf16.csv") == read_gpus(
        gpu / "nvidia-smi_preflight_query_server_up_bf16.csv")
    # The plain `nvidia-smi` table: name and memory from the table, compute capability from
    # servers/hardware (the table has none).
    table = read_gpus(gpu / "nvidia-smi_server_up_bf16.txt")
    assert [(g.index, g.name, g.cc_text, g.memory_total_mib, g.memory_used_mib) for g in table] \
        == [(0, "NVIDIA H200", "9.0", 143771, 133711)]
    assert read_gpus(gpu / "nvidia-smi_idle.txt")[0].memory_used_mib == 0
    with pytest.raises(ServelabError, match="keep the header line"):
        read_gpus(gpu / "nvidia-smi_query_idle_noheader_nounits.csv")


def test_a_plain_table_of_an_unknown_gpu_asks_for_the_csv_query():
    text = (CAPTURED / "gpu" / "nvidia-smi_idle.txt").read_text().replace(
        "NVIDIA H200    ", "NVIDIA Z9000   ")
    with pytest.raises(ServelabError, match="has no compute capability; save `nvidia-smi "
                                            "--query-gpu"):
        parse_gpu_csv(text, "pasted.txt")


def test_topology_with_p2p_tables_after_the_matrix():
    # Written (not captured): the 2x H200 matrix, its legend, then a P2P status table in
    # nvidia-smi's layout (`nvidia-smi topo -p2p r`), which some drivers print after the matrix.
    text = (GPUS / "h200_x2_topo.txt").read_text() + (
        "\n\tGPU0\tGPU1\t\n GPU0\tX\tNS\t\n GPU1\tNS\tX\t\n\nLegend:\n\n  X    = Self\n"
        "  OK   = Status Ok\n  NS   = Not supported\n")
    assert parse_topology(text) == {(0, 1): "NV18", (1, 0): "NV18"}


def test_preflight_on_the_gpu_the_server_under_test_holds(cli):
    """Live preflight against a running server (here a real socket serving the /metrics page of
    the captured BF16 server): the memory it holds is not a refusal; its KV cache is reported."""
    import http.server
    import threading

    page = (CAPTURED / "bf16" / "metrics_after.txt").read_bytes()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(page if self.path == "/metrics" else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    gpus = CAPTURED / "gpu" / "nvidia-smi_server_up_bf16.txt"
    try:
        code, out, _ = cli("preflight", "bf16", "--gpus", gpus)
        assert code == 1 and "REFUSE" in out
        assert "measured by" in out and "applies when a new server starts" in out
        assert "--url URL" in out
        code, out, _ = cli("preflight", "bf16", "--gpus", gpus, "--url", url)
    finally:
        server.shutdown()
    assert code == 0, out
    assert "REFUSE" not in out
    assert "gpu_memory_utilization 0.92, 132,215 blocks x 16 = 2,115,440 KV tokens" in out
    assert "the refusal for memory in use applies only to starting a new server" in out


def test_an_external_backend_is_judged_as_already_up():
    from servelab.orchestration.preflight_sources import matrix_preflight

    report = matrix_preflight(load_variant("bf16", environ={}), "external", "H200",
                              str(TINY), gpus_file=CAPTURED / "gpu" /
                              "nvidia-smi_preflight_query_server_up_bf16.csv")
    assert not report.refused, report.render()
    assert report.server is not None and report.server.kv_tokens is None


def test_the_kv_estimate_at_vllm_026s_default_utilization():
    # vLLM 0.26 defaults to 0.92 (captured log); at 0.9 the estimate was 0.97x the real cache.
    report = run_preflight(load_variant("bf16", environ={}),
                           read_gpus(CAPTURED / "gpu" / "nvidia-smi_preflight_query_idle.csv"),
                           "idle.csv")
    assert report.kv_tokens / 2_115_440 == pytest.approx(1.0, abs=0.01)   # captured bf16 log
