"""Verify on saved vLLM start-up logs and /metrics pages, and record the verdict on a run."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from servelab.orchestration.serverlog import parse_log, parse_metrics
from servelab.orchestration.verify import record, verify
from servelab.specs.variants import load_variant

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "servers" / "logs"
GPUS = REPO / "servers" / "gpus"


def test_log_facts():
    f = parse_log((LOGS / "a10g_fp8.log").read_text())
    assert f.fp8_marlin_fallback and f.kernels == ["MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"]
    assert f.quantization == "fp8" and f.kv_cache_tokens == 196_416
    assert (f.max_concurrency_len, f.max_concurrency) == (8192, 23.98)
    assert f.vllm_version == "0.11.0" and f.model == "Qwen/Qwen2.5-7B-Instruct"
    g = parse_log((LOGS / "l40s_gptq_int4.log").read_text())
    assert g.marlin_conversion == "gptq_marlin" and g.quantization == "gptq_marlin"
    s = parse_log((LOGS / "l40s_spec_ngram.log").read_text())
    assert s.speculative == {"method": "ngram", "num_speculative_tokens": 5}
    t = parse_log((LOGS / "l4x4_tp2.log").read_text())
    assert t.tensor_parallel_size == 2 and t.custom_allreduce_disabled
    # Newer vLLM merges the two KV lines into one.
    m = parse_log("(EngineCore_DP0 pid=9) INFO 01-02 03:04:05 [kv_cache_utils.py:1234] GPU KV cache "
                  "size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x")
    assert (m.kv_cache_tokens, m.max_concurrency) == (34_952, 4.27)


@pytest.mark.parametrize("variant, log, status, check, words", [
    ("bf16", "l40s_bf16.log", "verified", "precision", "unquantized"),
    ("fp8", "l40s_fp8.log", "verified", "precision", "native FP8 W8A8"),
    ("fp8", "a10g_fp8.log", "mismatch", "precision", "weight-only FP8 through Marlin (W8A16)"),
    ("gptq_int4", "l40s_gptq_int4.log", "verified", "precision", "W4A16 (gptq_marlin)"),
    ("awq_int4", "l40s_awq_forced.log", "verified", "precision", "forces the slow kernel"),
    ("tp2", "l4x4_tp2.log", "verified", "parallelism", "custom all-reduce disabled"),
    ("spec_ngram", "l40s_spec_ngram.log", "verified", "speculative", "ngram, k=5"),
    ("spec_draft", "l40s_spec_ngram.log", "mismatch", "speculative", "claims draft_model"),
    ("bf16", "l40s_fp8.log", "mismatch", "precision", "claims bf16 but the server quantizes"),
    ("bf16", "a10g_llama_bf16_too_long.log", "failed_to_start", "startup",
     "To serve at least one request with the models's max seq len (131072)"),
])
def test_verdicts_on_saved_logs(variant, log, status, check, words):
    verdict = verify(load_variant(variant, environ={}), LOGS / log)
    found = {c.name: c for c in verdict.checks}
    assert verdict.status == status, verdict.summary()
    assert words in found[check].detail, verdict.summary()


def test_a_truncated_log_is_unverified(tmp_path):
    lines = (LOGS / "l40s_fp8.log").read_text().splitlines()
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(lines[:4]) + "\n")  # captured before the engine started
    verdict = verify(load_variant("fp8", environ={}), cut)
    assert verdict.status == "unverified" and verdict.flags == ["unverified"]


def test_metrics_confirm_speculation_and_engines():
    f = parse_metrics((LOGS / "l40s_spec_ngram.metrics").read_text())
    assert f.spec_decode_metrics and f.cache_config["num_gpu_blocks"] == "28028"
    assert f.kv_cache_tokens == 28028 * 16
    verdict = verify(load_variant("spec_ngram", environ={}), LOGS / "l40s_spec_ngram.log",
                     metrics_path=LOGS / "l40s_spec_ngram.metrics")
    assert verdict.status == "verified"
    # /metrics alone: two engines confirm DP 2, but nothing says what precision runs.
    dp2 = verify(load_variant("dp2", environ={}), metrics_path=LOGS / "h100x2_dp2.metrics")
    assert {c.name: c.status for c in dp2.checks}["parallelism"] == "ok"
    assert dp2.status == "unverified"
    assert verify(load_variant("spec_draft", environ={}),
                  metrics_path=LOGS / "h100x2_dp2.metrics").status == "mismatch"


def _db_with_run(path: Path, run_id: str) -> None:
    con = duckdb.connect(str(path))
    con.execute((REPO / "src/servelab/store/schema.sql").read_text())
    con.execute("INSERT INTO runs (run_id, variant, flags) VALUES (?, 'fp8', ['generator_saturated'])",
                [run_id])
    con.close()


def test_verdict_is_recorded_on_the_run(tmp_path, cli):
    db = tmp_path / "runs.duckdb"
    _db_with_run(db, "r1")
    code, out, _ = cli("verify", "fp8", "--log", LOGS / "a10g_fp8.log", "--gpus",
                       GPUS / "a10g.csv", "--db", db, "--run", "r1")
    assert code == 1 and "MISMATCH" in out and "preflight estimated" in out
    con = duckdb.connect(str(db))
    verification, flags = con.execute("SELECT verification, flags FROM runs").fetchone()
    con.close()
    data = json.loads(verification)
    assert data["status"] == "mismatch" and data["facts"]["fp8_marlin_fallback"] is True
    assert sorted(flags) == ["generator_saturated", "variant_mismatch"]
    # Verifying again with the right evidence replaces the verdict and its flag.
    verdict = verify(load_variant("fp8", environ={}), LOGS / "l40s_fp8.log")
    record(db, "r1", verdict)
    con = duckdb.connect(str(db))
    assert con.execute("SELECT flags FROM runs").fetchone()[0] == ["generator_saturated"]
    con.close()
    code, _, err = cli("verify", "fp8", "--log", LOGS / "l40s_fp8.log", "--db", db, "--run", "nope")
    assert code == 2 and "no run 'nope'" in err


# ---- real vLLM 0.26 captures (servers/captured: one H200, see its README) ----------------------
CAPTURED = REPO / "servers" / "captured"
SERVED_FROM = "/tmp/vllm/qwen2_5_7b"   # the model folder the captured servers were started with


@pytest.mark.parametrize("name", ["bf16", "fp8", "spec_ngram", "tuned", "kv_fp8",
                                  "no_prefix_cache"])
def test_captured_vllm_026_servers_verify(name):
    written = CAPTURED / "session" / "scripts" / "variants" / f"{name}.yaml"
    variant = load_variant(written if written.is_file() else name,
                           environ={"SERVELAB_MODEL": SERVED_FROM})
    folder = CAPTURED / name
    verdict = verify(variant, log_path=folder / "startup.log",
                     metrics_path=folder / "metrics_after.txt")
    assert verdict.status == "verified", verdict.summary()
    facts = verdict.facts
    assert facts["vllm_version"] == "0.26.0" and facts["model"] == SERVED_FROM
    assert facts["cache_config"]["gpu_memory_utilization"] == (
        "0.95" if name == "tuned" else "0.92")   # vLLM 0.26's default is 0.92
    # tuned's log ends with vLLM's EngineDeadError at SIGTERM: shutdown, not a failed start.
    assert not facts["errors"] and not facts["runtime_errors"]


def test_captured_failed_start_names_its_root_cause():
    variant = load_variant("bf16", environ={"SERVELAB_MODEL": SERVED_FROM})
    verdict = verify(variant, log_path=CAPTURED / "failed_start" / "startup.log")
    assert verdict.status == "failed_to_start"
    startup = next(c for c in verdict.checks if c.name == "startup")
    # The KV-cache ValueError, not vLLM's "Engine core initialization failed" wrapper after it.
    assert startup.detail.startswith("ValueError: To serve at least one request with the "
                                     "model's max seq len (32768)")


def test_a_missing_module_is_the_failed_starts_root_cause():
    # Written (not captured) from vLLM's format: an engine core dying on an import, then the API
    # server's wrapper; a WARNING quoting an OSError in backticks is not an error.
    log = """\
(APIServer pid=7) WARNING 12-01 10:59:23 [system_utils.py:299] Found ulimit of 20000 ... `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(APIServer pid=7) INFO 12-01 10:59:24 [utils.py:233] non-default args: {'model_tag': '/m', 'model': '/m'}
(EngineCore pid=9) ERROR 12-01 11:00:30 [core.py:1330] EngineCore failed to start.
(EngineCore pid=9) ERROR 12-01 11:00:30 [core.py:1330] Traceback (most recent call last):
(EngineCore pid=9) ERROR 12-01 11:00:30 [core.py:1330]   File "/site/vllm/v1/attention/backends/flash_attn.py", line 12, in <module>
(EngineCore pid=9) ERROR 12-01 11:00:30 [core.py:1330] ModuleNotFoundError: No module named 'vllm.vllm_flash_attn._vllm_fa2_C'
(APIServer pid=7) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
    facts = parse_log(log)
    assert facts.errors[0] == ("ModuleNotFoundError: No module named "
                               "'vllm.vllm_flash_attn._vllm_fa2_C'")
    assert len(facts.errors) == 2   # the wrapper is kept, after the root cause


def test_data_parallel_engines_each_printing_dp1_make_dp2():
    # Written (not captured) from vLLM's format: the API server's arguments, then one engine core
    # per DP rank, each printing its own data_parallel_size=1.
    log = "\n".join([
        "(APIServer pid=1) INFO 12-01 10:00:00 [utils.py:233] non-default args: {'model_tag': "
        "'Qwen/Qwen2.5-7B-Instruct', 'model': 'Qwen/Qwen2.5-7B-Instruct', "
        "'max_model_len': 8192, 'data_parallel_size': 2}",
        *(f"(EngineCore_DP{r} pid={10 + r}) INFO 12-01 10:00:0{r} [core.py:116] Initializing a "
          f"V1 LLM engine (v0.26.0) with config: model='Qwen/Qwen2.5-7B-Instruct', "
          f"speculative_config=None, dtype=torch.bfloat16, tensor_parallel_size=1, "
          f"pipeline_parallel_size=1, data_parallel_size=1, quantization=None, "
          f"enforce_eager=False" for r in (0, 1)),
    ])
    facts = parse_log(log)
    assert facts.data_parallel_size == 2
    # The DP /metrics page (servers/logs, written) carries one cache_config_info per engine.
    parse_metrics((LOGS / "h100x2_dp2.metrics").read_text(), facts)
    assert [c["engine"] for c in facts.cache_configs] == ["0", "1"]
    verdict = verify(load_variant("dp2", environ={}), metrics_path=LOGS / "h100x2_dp2.metrics")
    parallel = next(c for c in verdict.checks if c.name == "parallelism")
    assert parallel.status == "ok" and "DP 2" in parallel.detail
    from servelab.orchestration.verify import judge
    parallel = next(c for c in judge(load_variant("dp2", environ={}), facts).checks
                    if c.name == "parallelism")
    assert parallel.status == "ok" and parallel.detail == "TP 1, DP 2"


# ---- version ranges (specs.server_kinds.vllm.versions) -----------------------------------------
def _int4_log(tmp_path, method: str, kernel: str, quant: str):
    """The real BF16 0.26 log with its engine line and kernel line as vLLM 0.26 writes them for a
    GPTQ/AWQ folder: quantization=auto_gptq (AutoGPTQConfig.get_name) and
    ``logger.info("Using %s for AutoGPTQLinearMethod", kernel_type.__name__)`` (auto_gptq.py)."""
    lines = []
    for line in (CAPTURED / "bf16" / "startup.log").read_text().splitlines():
        if "Initializing a V1 LLM engine" in line:
            line = line.replace("quantization=None", f"quantization={quant}")
            lines.append(line)
            prefix = line.split("[core.py")[0]
            lines.append(f"{prefix}[{quant}.py:357] Using {kernel} for {method}")
            continue
        lines.append(line)
    path = tmp_path / f"{quant}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("variant, env, method, quant", [
    ("gptq_int4", "SERVELAB_MODEL_GPTQ", "AutoGPTQLinearMethod", "auto_gptq"),
    ("awq_int4", "SERVELAB_MODEL_AWQ", "AutoAWQMarlinLinearMethod", "auto_awq"),
])
@pytest.mark.parametrize("kernel", ["MacheteLinearKernel", "MarlinLinearKernel"])
def test_026_int4_kernel_lines_verify(tmp_path, variant, env, method, quant, kernel):
    log = _int4_log(tmp_path, method, kernel, quant)
    verdict = verify(load_variant(variant, environ={env: SERVED_FROM}), log)
    found = {c.name: c for c in verdict.checks}
    assert verdict.status == "verified", verdict.summary()
    assert found["precision"].detail == f"W4A16 ({kernel} for {method})"
    assert found["version"].detail == "vLLM 0.26.0 (range [0.26, 0.28), torch 2.11.0)"
    # a GPTQ folder whose layers stayed 16-bit (no kernel line) is not taken for Int4
    plain = load_variant(variant, environ={env: SERVED_FROM})
    bf16_log = verify(plain, CAPTURED / "bf16" / "startup.log")
    assert bf16_log.status == "mismatch"


class _FakeVllm:
    """A real socket answering /version and /metrics as a vLLM of ``version`` would."""

    def __init__(self, version: str, families: list[str]):
        import http.server
        import threading

        body = {"/version": json.dumps({"version": version}).encode(),
                "/metrics": "".join(f"# HELP {f} x\n# TYPE {f} gauge\n{f}{{engine=\"0\"}} 1.0\n"
                                    for f in families).encode()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                data = body.get(self.path)
                self.send_response(200 if data else 404)
                self.send_header("Content-Type", "application/json" if self.path == "/version"
                                 else "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                self.wfile.write(data or b"")

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_verify_takes_the_version_from_the_servers_version_endpoint():
    # No log: the range comes from GET /version; a 0.33-only family on a server that says 0.26
    # is named (another version or a fork), one that says 0.33 is fine.
    families = ["vllm:num_requests_running", "vllm:admission_rejections"]
    for version, status in (("0.33.0", "ok"), ("0.26.0", "warn"), ("0.40.1", "warn")):
        server = _FakeVllm(version, families)
        try:
            verdict = verify(load_variant("bf16", environ={}), url=server.url)
        finally:
            server.close()
        check = next(c for c in verdict.checks if c.name == "version")
        assert verdict.facts["vllm_version"] == version
        assert check.status == status, check.detail
        if version == "0.26.0":
            assert "0.26 does not define (vllm:admission_rejections)" in check.detail
        if version == "0.40.1":
            assert "newer than the newest release read (0.33.0)" in check.detail


def test_batched_tokens_default_is_checked_per_release_and_gpu():
    from servelab.orchestration.gpus import Gpu
    from servelab.orchestration.verify_rules import judge
    from servelab.specs.server_kinds import ServerFacts

    b200 = [Gpu(0, "NVIDIA B200", (10, 0), 183_359, 0)]
    for version, status in (("0.26.0", "ok"), ("0.33.0", "warn")):
        facts = ServerFacts(vllm_version=version, max_num_batched_tokens=8192)
        check = next(c for c in judge(load_variant("bf16", environ={}), facts, b200).checks
                     if c.name == "version")
        assert check.status == status, check.detail
    assert "0.33's default on a NVIDIA B200 is 16384" in check.detail
