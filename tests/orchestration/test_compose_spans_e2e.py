"""The server's spans through a real Docker engine (issue 21): `servelab matrix --backend
compose`, the simulator's image standing in for vLLM (it takes vLLM's flags and sends vLLM's
spans), the generated service told to send them to the host (``host.docker.internal``, the host
gateway), the host's run receiving them where the containers reach it (``SERVELAB_OTLP_HOST``
set to the Docker bridge's address: opt-in, loopback otherwise). Every request of the run has
its phases. The engine, the project copy and the image are test_compose_e2e's (skipped with the
reason where no engine can be had)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_compose_e2e import PROJECT, SIM_AS_VLLM, announce, engine, run  # noqa: E402,F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_matrix_backend_compose_stores_the_servers_spans(engine, tmp_path, request):  # noqa: F811
    from servelab.core import procs

    gateway = run(["docker", "network", "inspect", "bridge", "--format",
                   "{{range .IPAM.Config}}{{.Gateway}} {{end}}"], engine.env,
                  engine.root).stdout.split()[0]
    override = tmp_path / "sim-as-vllm.yml"
    override.write_text("services:\n" + SIM_AS_VLLM.format(service="vllm-fp8"))
    env = dict(engine.env, COMPOSE_FILE=f"docker-compose.yml{os.pathsep}{override}",
               VLLM_PORT=str(procs.free_port()), SERVELAB_HOME=str(engine.root),
               SERVELAB_OTLP_HOST=gateway)
    servelab = str(Path(sys.executable).parent / "servelab")
    db = tmp_path / "spans.duckdb"
    try:
        done = run([servelab, "matrix", "--variants", "fp8", "--profile",
                    "traffic_profiles/smoke.yaml", "--backend", "compose", "--gpus",
                    "servers/gpus/l40s.csv", "--startup-timeout", "120", "--no-report",
                    "--db", str(db), "--logs", str(tmp_path / "logs")], env, engine.root,
                   timeout=420, check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    finally:
        run(["docker", "compose", "--profile", "fp8", "down", "--volumes", "--remove-orphans"],
            env, engine.root, timeout=180, check=False)
    assert "spans reach this host's run only with" not in done.stdout
    con = duckdb.connect(str(db), read_only=True)
    try:
        sent, spans, matched, without, dups = con.execute(
            "SELECT requests_sent, spans, spans_matched, requests_without_span, "
            "duplicate_spans FROM span_join").fetchone()
        phases = con.execute("SELECT count(*) FILTER (WHERE has_span), count(*), "
                             "any_value(clock_offset_source) FROM request_phases").fetchone()
    finally:
        con.close()
    assert sent > 5 and spans == matched == sent and without == dups == 0
    assert phases[0] == phases[1] == sent and phases[2] == "same_host"
    announce(request.config, f"ran: servelab matrix --backend compose, {spans} spans from the "
             f"container to the host's receiver on {gateway}, every request joined")


def test_a_variants_loadgen_service_receives_its_servers_spans(engine, tmp_path,  # noqa: F811
                                                                request):
    """`docker compose --profile fp8 up vllm-fp8 loadgen-fp8`, as the generated file's header
    says: the server sends to its loadgen by service name, whose `servelab run` receives on
    the compose network (SERVELAB_OTLP_HOST=0.0.0.0 in its container, no published port)."""
    from servelab.core import procs

    override = tmp_path / "sim-as-vllm.yml"
    override.write_text("services:\n" + SIM_AS_VLLM.format(service="vllm-fp8"))
    env = dict(engine.env, COMPOSE_FILE=f"docker-compose.yml{os.pathsep}{override}",
               VLLM_PORT=str(procs.free_port()), SERVELAB_PROFILE="traffic_profiles/smoke.yaml")
    try:
        done = run(["docker", "compose", "--profile", "fp8", "up", "--exit-code-from",
                    "loadgen-fp8", "vllm-fp8", "loadgen-fp8"], env, engine.root, timeout=420,
                   check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    finally:
        run(["docker", "compose", "--profile", "fp8", "down", "--volumes", "--remove-orphans"],
            env, engine.root, timeout=180, check=False)
    con = duckdb.connect(str(engine.root / "results" / "servelab.duckdb"), read_only=True)
    try:
        (run_id,) = con.execute("SELECT run_id FROM runs WHERE variant = 'fp8' ORDER BY "
                                "started_unix DESC LIMIT 1").fetchone()
        sent, spans, matched, without = con.execute(
            "SELECT requests_sent, spans, spans_matched, requests_without_span FROM span_join "
            "WHERE run_id = ?", [run_id]).fetchone()
        offset, source = con.execute("SELECT clock_offset_ms, clock_offset_source FROM "
                                     "span_clock WHERE run_id = ?", [run_id]).fetchone()
    finally:
        con.close()
    assert sent > 5 and spans == matched == sent and without == 0
    # two containers of one host: one clock, so the estimate (a target that is not loopback)
    # comes out near zero
    assert source == "min_delay_midpoint" and abs(offset) < 5.0, (offset, source)
    announce(request.config, f"ran: docker compose --profile fp8 up vllm-fp8 loadgen-fp8, "
             f"{spans} spans to loadgen-fp8:4318, clock offset estimated {offset:.2f} ms")
