"""GPU telemetry: a real dcgm-exporter page over a real socket, NVML as this host really has it
(no driver: a note, never a failure), a stand-in NVML library object for the sampling arithmetic
(nothing else can give NVML's answers without a GPU), and `servelab run` on the simulator with
the exporter: gpu_metrics, J/token in gpu_stage_energy and the summary, and server_iterations
whose tokens add up to the requests'."""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).parent / "data" / "dcgm"
_ENERGY = re.compile(r"^(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{[^}]*\}) (\d+)$", re.M)
_POWER = re.compile(r"^(DCGM_FI_DEV_POWER_USAGE\{[^}]*\}) ([0-9.]+)$", re.M)


@contextmanager
def dcgm_exporter(page: str = "rtx6000ada.prom", watts: float | None = None):
    """Yields the page's URL; with ``watts`` the power reads that and the counter (mJ) grows at
    that rate from the page's own value."""
    text = (DATA / page).read_text()
    t0 = time.time()
    served = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text
            if watts is not None:
                grown = lambda m: f"{m.group(1)} {int(m.group(2)) + int(watts * (time.time() - t0) * 1e3)}"  # noqa: E731
                body = _POWER.sub(lambda m: f"{m.group(1)} {watts:.6f}", _ENERGY.sub(grown, body))
            data = body.encode()
            served["n"] += 1
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


import subprocess
import sys
from types import SimpleNamespace

import duckdb
import pytest

from servelab.core.errors import ServelabError
from servelab.orchestration import gpu_telemetry as gt

REPO = Path(__file__).resolve().parents[2]


def test_a_real_exporter_page_is_read_with_its_units():
    (row,) = gt.parse_dcgm((DATA / "rtx6000ada.prom").read_text(), 1.0)
    assert row["gpu"] == 0 and row["name"] == "NVIDIA RTX 6000 Ada Generation"
    assert row["uuid"] == "GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc"
    assert (row["util_pct"], row["sm_clock_mhz"], row["mem_used_mib"]) == (1, 210, 46614)
    assert row["power_w"] == pytest.approx(22.582) and row["energy_j"] == pytest.approx(955287.014)
    assert row["temp_c"] is None          # that exporter's counters left the temperature out
    # the MIG instance's series are not the GPU's; the page has no HELP/TYPE lines
    (a100,) = gt.parse_dcgm((DATA / "a100_mig.prom").read_text(), 1.0)
    assert (a100["temp_c"], a100["mem_used_mib"], a100["util_pct"]) == (61, 4845, None)
    with pytest.raises(ServelabError, match="not a Prometheus page"):
        gt.parse_dcgm("<html>login</html>\n{", 1.0)


def test_the_sampler_reads_the_exporter_over_a_socket(tmp_path):
    with dcgm_exporter(watts=250.0) as url:
        source = gt.DcgmSource(url)
        sampler = gt.GpuSampler(source, tmp_path / "s.jsonl", interval_s=0.05).start()
        time.sleep(0.6)
        sampler.stop()
    rows = gt.read_samples(tmp_path / "s.jsonl", "r1")
    assert sampler.failures == 0 and len(rows) == sampler.samples >= 8
    assert all(r["power_w"] == 250.0 and r["source"] == "dcgm" for r in rows)
    rate = (rows[-1]["energy_j"] - rows[0]["energy_j"]) / (rows[-1]["t_unix"] - rows[0]["t_unix"])
    assert rate == pytest.approx(250.0, rel=0.1)
    assert "samples from dcgm every 0.05 s" in sampler.note()


def test_no_gpu_here_and_no_exporter_are_notes_not_failures(tmp_path):
    nvml, why = gt.open_source(gt.parse_spec("nvml"), "http://127.0.0.1:8000", False)
    assert nvml is None and why.startswith("gpu_metrics: none (NVML did not start")
    gone, why = gt.open_source(gt.parse_spec("dcgm=http://127.0.0.1:9/metrics"), None, False)
    assert gone is None and "127.0.0.1:9/metrics" in why
    sim, why = gt.open_source(gt.parse_spec("auto"), None, True)
    assert sim is None and "simulator uses no GPU" in why
    remote, why = gt.open_source(gt.parse_spec("auto"), "http://10.1.2.3:8000", False)
    assert remote is None and "dcgm=URL" in why
    assert gt.open_source(gt.parse_spec("off"), None, False) == (None, "")
    with pytest.raises(ServelabError, match="--gpu-telemetry gpu: allowed auto, nvml, off"):
        gt.parse_spec("gpu")


class _NVMLError(Exception):
    pass


def _nvml(energy_supported=True, gpus=2):
    """The few pynvml calls the sampler makes, answering as an H200 does (units as NVML's)."""
    def energy(h):
        if not energy_supported:
            raise _NVMLError("Not Supported")
        return 1_000_000 + h * 10
    return SimpleNamespace(
        NVMLError=_NVMLError, NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: gpus,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}", nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=75 * 2**30, total=141 * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 512_345, nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980, nvmlDeviceGetTemperature=lambda h, s: 48)


def test_nvml_answers_become_rows_in_the_tables_units(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    source = gt.NvmlSource(_nvml())
    (row,) = source.sample()
    assert (row["gpu"], row["uuid"], row["name"]) == (1, "GPU-1", "NVIDIA H200")
    assert (row["util_pct"], row["sm_clock_mhz"], row["temp_c"]) == (87, 1980, 48)
    assert row["mem_used_mib"] == 75 * 1024 and row["power_w"] == pytest.approx(512.345)
    assert row["energy_j"] == pytest.approx(1000.01)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    rows = gt.NvmlSource(_nvml(energy_supported=False)).sample()
    assert [r["gpu"] for r in rows] == [0, 1] and all(r["energy_j"] is None for r in rows)


@pytest.mark.slow
def test_a_simulated_run_gets_iterations_and_energy_per_token(tmp_path):
    db = tmp_path / "t.duckdb"
    with dcgm_exporter(watts=300.0) as url:
        done = subprocess.run(
            [sys.executable, "-m", "servelab.cli", "run", "--profile",
             str(REPO / "traffic_profiles" / "smoke.yaml"), "--db", str(db),
             "--gpu-telemetry", f"dcgm={url}", "--quiet"],
            capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "J/token" in done.stdout and "note: gpu_metrics:" in done.stdout
    con = duckdb.connect(str(db), read_only=True)
    try:
        its = con.execute("SELECT count(*), sum(context_tokens), sum(generation_tokens), "
                          "sum(context_requests) FROM server_iterations").fetchone()
        req = con.execute("SELECT count(*), sum(prompt_tokens - coalesce(cached_tokens, 0)), "
                          "sum(output_tokens) FROM requests WHERE error_kind IS NULL").fetchone()
        energy = con.execute("SELECT stage, method, power_mean_w, joules_per_output_token, "
                             "output_tokens_per_joule, output_tokens, energy_j FROM "
                             "gpu_stage_energy ORDER BY stage").fetchall()
        tput = dict(con.execute("SELECT stage, output_tokens_per_s FROM stage_summary "
                                "WHERE class_name = '(all)'").fetchall())
        samples = con.execute("SELECT count(*) FROM gpu_metrics").fetchone()[0]
    finally:
        con.close()
    # every prompt token is a context token of some step; a request's first output token comes
    # from its last prefill step, every later one from a generation step
    n, prompt, output = req
    assert its[0] > 0 and its[1] == prompt and its[2] == output - n and its[3] >= n
    assert samples >= 10 and [e[0] for e in energy] == [0, 1]
    for stage, method, power, jpt, tpj, tokens, joules in energy:
        assert method == "counter" and power == pytest.approx(300.0, rel=0.05)
        assert jpt == pytest.approx(power / tput[stage]) and tpj == pytest.approx(1 / jpt)
        assert joules == pytest.approx(jpt * tokens)
    # the report's table reads the same view
    from servelab.analysis.db import open_for_reading
    from servelab.analysis.report_sections import energy_html

    con = open_for_reading(db)
    run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    html = energy_html(con, run_id)
    con.close()
    assert html.startswith("<h3>GPU energy</h3>") and f"{energy[1][3]:.3f}" in html


def test_the_standalone_sampler_file_is_ingested_into_a_run(tmp_path, cli):
    from servelab.store.db import open_db

    out = tmp_path / "samples.jsonl"
    with dcgm_exporter(watts=100.0) as url:
        proc = subprocess.Popen([sys.executable, "-m", "servelab.orchestration.gpu_telemetry",
                                 "--out", str(out), "--interval", "0.1", "--dcgm", url,
                                 "--duration", "0.6"], stdout=subprocess.PIPE, text=True)
        said, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and said.startswith("gpu_metrics: ")
    with open(out, "ab") as f:
        f.write(b'{"t_unix": 1.0, "sour')          # a sampler killed mid-line
    db = tmp_path / "g.duckdb"
    con = open_db(db)
    con.execute("INSERT INTO runs (run_id, started_unix, status) VALUES ('r', 0, 'completed')")
    con.close()
    code, printed, err = cli("ingest-gpu", "--run", "r", out, "--db", db)
    n = len(out.read_bytes().splitlines()) - 1
    assert code == 0 and printed.startswith(f"{n} GPU samples stored") and n >= 4
    code, printed, err = cli("ingest-gpu", "--run", "r", out, "--db", db)   # again: replaced
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), min(power_w) FROM gpu_metrics").fetchone() == (n, 100.0)
    con.close()
