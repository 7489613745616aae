"""`servelab sim --variant sglang_fp8` as its own process over a real socket: it speaks SGLang's
dialect (start-up log, sglang:* /metrics, /flush_cache) and verify reads it as an SGLang
server: native FP8 on an L40S, the KV pool the log states equal to the one /metrics states."""
from __future__ import annotations

import json
import sys
import urllib.request

from servelab.core import procs
from servelab.orchestration.verify import verify
from servelab.specs.server_kinds import SGLANG
from servelab.specs.variants import load_variant


def test_sim_serves_an_sglang_variant_in_sglangs_dialect(tmp_path):
    log = tmp_path / "sim.log"
    child = procs.spawn("sglang sim", [sys.executable, "-m", "servelab.commands.sim", "--variant",
                                       "sglang_fp8", "--hardware", "L40S", "--port", "0",
                                       "--ready-file", str(tmp_path / "ready")], log,
                        ready_file=tmp_path / "ready")
    try:
        url = child.wait_ready(60)
        body = json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi " * 120}]}).encode()
        for _ in range(2):  # the second hits the first's prefix in the radix cache
            urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", body, {
                "Content-Type": "application/json"}), timeout=30)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        families = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines()
                    if line and not line.startswith("#")}
        assert not any(name.startswith("vllm:") for name in families)
        assert {SGLANG.metrics[k] for k in ("running", "waiting", "kv_cache_usage",
                                            "prompt_tokens", "prefix_cache_hits")} <= families
        cached = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                      if line.startswith(SGLANG.metrics["prefix_cache_hits"]))
        assert cached > 100  # token-granular: all but the last of the shared prompt's tokens
        flushed = urllib.request.urlopen(urllib.request.Request(
            url + SGLANG.reset_prefix_cache_path, b"", method="POST"), timeout=10)
        assert flushed.status == 200
        verdict = verify(load_variant("sglang_fp8"), log_path=log, url=url)
    finally:
        child.stop()
    assert verdict.status == "verified", verdict.summary()
    facts = verdict.facts
    assert facts["startup_complete"] and facts["engines"] == ["0"]
    assert "W8A8" in facts["kernels"][0]
    assert facts["kv_cache_tokens"] > 100_000
