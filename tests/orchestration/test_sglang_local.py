"""`--backend local` for SGLang over a real process and socket: `python3 -m sglang.launch_server`
is played by a stand-in `python3` on PATH that checks SGLang's module, records its arguments and
runs data/sglang/standin_server.py (SGLang's routes, its WRITTEN log and /metrics); and the Compose
services of the SGLang variants."""
from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from servelab.orchestration import backends, compose
from servelab.orchestration.verify import verify
from servelab.specs.variants import load_variant

STANDIN = Path(__file__).parent / "data" / "sglang" / "standin_server.py"


def test_local_backend_runs_sglangs_launch_server(tmp_path, stand_in):
    argv_file = tmp_path / "argv.txt"
    stand_in("python3", f"""[ "$1" = -m ] && [ "$2" = sglang.launch_server ] || exit 64
shift 2
exec {sys.executable} {STANDIN} "$@"
""", argv_file)
    variant = load_variant("sglang_bf16", environ={})
    server = backends.start_server("local", variant, tmp_path)
    try:
        backends.wait_healthy(server, 30)
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
            assert b"sglang:num_running_reqs" in resp.read()
        verdict = verify(variant, log_path=server.log_path, url=server.url)
        assert verdict.status == "verified", verdict.summary()
        assert verdict.sources[-1] == server.url + "/metrics"
        assert backends.reset_prefix_cache(server.url, path=variant.kind.reset_prefix_cache_path)
        assert not backends.reset_prefix_cache(server.url)   # vLLM's route is not SGLang's
    finally:
        server.stop()
    assert not server.alive()
    port = server.url.rsplit(":", 1)[1]
    assert argv_file.read_text().splitlines() == [
        "-m", "sglang.launch_server", "--model-path", variant.model, *variant.serve_args,
        "--enable-metrics", "--host", "127.0.0.1", "--port", port]


def test_the_compose_services_run_sglangs_image_with_its_entrypoint():
    for name in ("sglang_bf16", "sglang_fp8"):
        variant = load_variant(name, environ={})
        own = compose.build_compose([variant])["services"][compose.service_name(variant)]
        service = {**own["<<"], **own}   # the x-sglang-server block, as Compose merges it
        assert service["image"] == "${SGLANG_IMAGE:-lmsysorg/sglang:v0.5.21}"
        assert service["entrypoint"] == ["python3", "-m", "sglang.launch_server"]
        command = service["command"]
        assert command[:2] == ["--model-path", f"${{SERVELAB_MODEL:-{variant.model}}}"]
        assert "--enable-metrics" in command and command[-7:-3] == ["--host", "0.0.0.0", "--port",
                                                                    "8000"]
        # its request traces go to the variant's own loadgen service (SGLang's switch, then the
        # endpoint), as OTLP/HTTP protobuf with a root span and slices only (trace level 1)
        loadgen = compose.loadgen_name(variant)
        assert command[-3:] == ["--enable-trace", "--otlp-traces-endpoint",
                                f"${{SERVELAB_OTLP_ENDPOINT:-http://{loadgen}:4318/v1/traces}}"]
        env = service["environment"]
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
        assert env["SGLANG_TRACE_LEVEL"] == "1"
        assert "VLLM_SERVER_DEV_MODE" not in service["environment"]


def test_what_run_target_tells_an_external_server_follows_its_kind():
    from servelab.orchestration import otlp

    assert otlp.kind_name(None, "sglang_bf16") == "sglang"
    assert otlp.kind_name(None, "only-a-label") == otlp.kind_name(None, None) == "vllm"
    assert otlp.kind_name("sglang", "bf16") == "sglang"
    sglang, vllm = otlp.told(4318, "sglang"), otlp.told(4318)
    assert sglang.startswith("--enable-trace --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces")
    assert "SGLANG_TRACE_LEVEL=1" in sglang and "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf" in sglang
    assert vllm.startswith("--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces and")
    assert "SGLANG" not in vllm
