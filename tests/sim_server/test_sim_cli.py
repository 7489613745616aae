"""``servelab sim`` as a process: --port 0 and --ready-file, refusal of a model that does not fit.
The one-shot refusals run through ``subprocess.run``: they check stdout and stderr apart (vLLM's
error line goes to stderr), which a ``core.procs`` child's single log cannot tell."""
import json
import signal
import subprocess
import sys
import urllib.request

from servelab.core.procs import spawn
from servelab.core.timeouts import HTTP_PROBE_S, SIM_READY_S, STOP_GRACE_S

CLI = [sys.executable, "-m", "servelab.cli", "sim"]        # the ``servelab sim`` console script
SIM = [sys.executable, "-m", "servelab.commands.sim"]      # what a parent process may spawn


def test_starts_serves_and_stops_on_sigterm(tmp_path):
    ready, log = tmp_path / "ready", tmp_path / "sim.log"
    child = spawn("servelab sim", CLI + [
        "--hardware", "H100", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--port", "0",
        "--ready-file", str(ready), "--log-stats-interval", "0",
        "--max-model-len", "2048", "--served-model-name", "small"], log, ready_file=ready)
    try:
        url = child.wait_ready(SIM_READY_S)
        with urllib.request.urlopen(url + "/v1/models", timeout=HTTP_PROBE_S) as r:
            assert [m["id"] for m in json.load(r)["data"]] == ["small"]
        child.send_signal(signal.SIGTERM)
        returncode = child.wait(STOP_GRACE_S)
        removed = not ready.exists()  # by the simulator itself on shutdown
    finally:
        child.stop()
    out = log.read_text()
    assert returncode == 0, out
    assert "GPU KV cache size:" in out and "Maximum concurrency for 2,048 tokens" in out
    assert f"at {url}" in out
    assert removed
    # vLLM's engine config line carries what verify needs, without the simulator's own line.
    from servelab.orchestration.serverlog import parse_log

    facts = parse_log("\n".join(line for line in out.splitlines() if "servelab sim:" not in line))
    assert facts.engine_config_seen and facts.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (facts.quantization, facts.dtype, facts.speculative_seen) == (None, "torch.bfloat16", True)
    assert (facts.tensor_parallel_size, facts.data_parallel_size) == (1, 1)
    assert facts.kv_cache_tokens and facts.max_num_batched_tokens == 8192


def test_refuses_a_model_that_does_not_fit_with_vllms_message():
    proc = subprocess.run(CLI + ["--hardware", "L4", "--model", "meta-llama/Llama-3.1-8B-Instruct"],
                          capture_output=True, text=True, timeout=SIM_READY_S)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "ValueError: To serve at least one request with the model's max seq len (131072)")
    assert "Try increasing gpu_memory_utilization or decreasing max_model_len" in proc.stderr
    assert "Model loading took" in proc.stdout


def test_bad_faults_and_flags_are_refused_clearly():
    proc = subprocess.run(SIM + ["--faults", "stall=0.1"], capture_output=True, text=True,
                          timeout=SIM_READY_S)
    assert proc.returncode == 2 and "stall needs a pause length" in proc.stderr
    proc = subprocess.run(SIM + ["--max-num-seqs", "many"], capture_output=True, text=True,
                          timeout=SIM_READY_S)
    assert proc.returncode == 2 and "--max-num-seqs" in proc.stderr
