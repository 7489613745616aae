"""``servelab sim`` as a process: --port 0 and --ready-file, refusal of a model that does not fit."""
import json
import signal
import subprocess
import sys
import time
import urllib.request

CLI = [sys.executable, "-m", "servelab.cli", "sim"]        # the ``servelab sim`` console script
SIM = [sys.executable, "-m", "servelab.commands.sim"]      # what a parent process may spawn


def test_starts_serves_and_stops_on_sigterm(tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        CLI + ["--hardware", "H100", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--port", "0",
               "--ready-file", str(ready), "--log-stats-interval", "0",
               "--max-model-len", "2048", "--served-model-name", "small"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not ready.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "timeout"
        url = ready.read_text().strip()
        with urllib.request.urlopen(url + "/v1/models") as r:
            assert [m["id"] for m in json.load(r)["data"]] == ["small"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "GPU KV cache size:" in out and "Maximum concurrency for 2,048 tokens" in out
    assert f"at {url}" in out
    assert not ready.exists()
    # vLLM's engine config line carries what verify needs, without the simulator's own line.
    from servelab.orchestration.serverlog import parse_log

    facts = parse_log("\n".join(line for line in out.splitlines() if "servelab sim:" not in line))
    assert facts.engine_config_seen and facts.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (facts.quantization, facts.dtype, facts.speculative_seen) == (None, "torch.bfloat16", True)
    assert (facts.tensor_parallel_size, facts.data_parallel_size) == (1, 1)
    assert facts.kv_cache_tokens and facts.max_num_batched_tokens == 8192


def test_refuses_a_model_that_does_not_fit_with_vllms_message():
    proc = subprocess.run(CLI + ["--hardware", "L4", "--model", "meta-llama/Llama-3.1-8B-Instruct"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "ValueError: To serve at least one request with the model's max seq len (131072)")
    assert "Try increasing gpu_memory_utilization or decreasing max_model_len" in proc.stderr
    assert "Model loading took" in proc.stdout


def test_bad_faults_and_flags_are_refused_clearly():
    proc = subprocess.run(SIM + ["--faults", "stall=0.1"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "stall needs a pause length" in proc.stderr
    proc = subprocess.run(SIM + ["--max-num-seqs", "many"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--max-num-seqs" in proc.stderr
