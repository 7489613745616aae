"""Server backends over real processes and sockets: the simulator, and `vllm serve` (played here by
a stand-in executable that hands vLLM's own arguments to the simulator)."""
from __future__ import annotations

import os
import stat
import sys
import urllib.request

import pytest

from servelab.core.errors import ServelabError
from servelab.core.procs import free_port
from servelab.orchestration import backends
from servelab.orchestration.verify import verify
from servelab.specs.variants import load_variant


def test_sim_backend_serves_verifies_and_stops(tmp_path):
    variant = load_variant("gptq_int4", environ={})
    server = backends.start_server("sim", variant, tmp_path, hardware="L4")
    try:
        backends.wait_healthy(server, 30)
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as resp:
            assert variant.model.encode() in resp.read()
        verdict = verify(variant, log_path=server.log_path, url=server.url)
        assert verdict.status == "verified", verdict.summary()
        # Started in dev mode, the simulator serves vLLM's /reset_prefix_cache.
        assert backends.reset_prefix_cache(server.url) is True
        assert "Successfully reset prefix cache" in server.log_path.read_text()
        assert backends.reset_prefix_cache(server.url + "/nothing-here") is False
    finally:
        server.stop()
    assert not server.alive()
    assert "GPU KV cache size" in server.log_path.read_text()


def test_a_server_that_cannot_start_reports_its_error(tmp_path):
    big = tmp_path / "big14b.yaml"
    big.write_text("name: big14b\ndescription: 14B in BF16\nmodel: Qwen/Qwen3-14B\n"
                   "serve_args: ['--max-model-len', '8192']\ngpus: 1\n"
                   "claims: {weights: bf16, activations: bf16, min_compute_capability: 8.0, "
                   "speculative: null}\n")
    with pytest.raises(ServelabError, match="did not start") as err:
        backends.start_server("sim", load_variant(big), tmp_path, hardware="L4")
    assert "CUDA out of memory" in str(err.value)


def test_local_backend_runs_vllm_serve_with_the_variant_arguments(tmp_path, stand_in):
    argv_file = tmp_path / "argv.txt"
    stand_in("vllm", stand_in.vllm_to_sim, argv_file)
    variant = load_variant("spec_ngram", environ={})
    server = backends.start_server("local", variant, tmp_path)
    try:
        backends.wait_healthy(server, 30)
        verdict = verify(variant, log_path=server.log_path, url=server.url)
        assert verdict.status == "verified", verdict.summary()
    finally:
        server.stop()
    argv = argv_file.read_text().splitlines()
    port = server.url.rsplit(":", 1)[1]
    assert argv == ["serve", variant.model, *variant.serve_args, "--host", "127.0.0.1",
                    "--port", port]


def test_local_and_external_refuse_what_they_cannot_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no vllm, no docker
    with pytest.raises(ServelabError, match="use --backend compose"):
        backends.start_server("local", load_variant("two_instances"), tmp_path)
    with pytest.raises(ServelabError, match="`vllm` is not installed"):
        backends.start_server("local", load_variant("bf16"), tmp_path)
    with pytest.raises(ServelabError, match="needs --url"):
        backends.start_server("external", load_variant("bf16"), tmp_path)
    with pytest.raises(ServelabError, match="`docker` is not installed"):
        backends.start_server("compose", load_variant("bf16"), tmp_path)


def test_compose_backend_drives_docker_compose(tmp_path, monkeypatch):
    """`docker` here is a stand-in that records each call and, for `up -d`, serves the simulator
    where the vLLM service would listen; the sequence of Compose commands is what is checked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    state = tmp_path / "state"
    state.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
[ "$1" = compose ] || exit 64
shift
[ "$1" = --profile ] || exit 65
profile="$2"; shift 2
case "$1" in
  up) setsid {sys.executable} -m servelab.commands.sim --variant "$profile" --hardware H100 \\
          --port "$VLLM_PORT" > {state}/sim.log 2>&1 < /dev/null &
      echo $! > {state}/pid ;;
  logs) cat {state}/sim.log ;;
  stop) kill "$(cat {state}/pid)"; while kill -0 "$(cat {state}/pid)" 2>/dev/null; do sleep 0.05; done ;;
  rm) ;;
  *) exit 66 ;;
esac
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    port = free_port()
    monkeypatch.setenv("VLLM_PORT", str(port))
    variant = load_variant("fp8", environ={})
    server = backends.start_server("compose", variant, tmp_path)
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        backends.wait_healthy(server, 30)
        server.refresh_log()
        verdict = verify(variant, log_path=server.log_path, url=server.url)
        assert verdict.status == "verified", verdict.summary()
    finally:
        server.stop()
    lines = calls.read_text().splitlines()
    assert lines[0] == "compose --profile fp8 up -d vllm-fp8"
    assert "compose --profile fp8 logs --no-color --no-log-prefix vllm-fp8" in lines
    assert lines[-2:] == ["compose --profile fp8 stop vllm-fp8", "compose --profile fp8 rm -f vllm-fp8"]
    assert "Serving" in server.log_path.read_text()


def test_another_server_kind_is_one_adapter(tmp_path, monkeypatch):
    """A second kind (here a stand-in spelling the model as a flag, like SGLang's --model-path)
    changes the command line, the Compose service and what start_local runs, and nothing else."""
    import dataclasses

    from servelab.orchestration import compose
    from servelab.specs import server_kinds

    kind = dataclasses.replace(server_kinds.VLLM, name="othersrv", label="Other",
                               command=("othersrv", "launch"), image="other/image:1",
                               image_entrypoint=(), model_positional=False,
                               flags={**server_kinds.VLLM.flags, "model": "--model-path"})
    monkeypatch.setitem(server_kinds.KINDS, "othersrv", kind)
    path = tmp_path / "other.yaml"
    path.write_text("name: other\ndescription: a second server kind\nserver: othersrv\n"
                    "model: Qwen/Qwen2.5-7B-Instruct\nserve_args: ['--max-model-len', '4096']\n"
                    "claims: {weights: bf16, activations: bf16, min_compute_capability: 8.0, "
                    "speculative: null}\n")
    variant = load_variant(path, environ={})
    assert variant.kind is kind
    assert compose.service_name(variant) == "othersrv-other"
    service = compose.build_compose([variant])["services"]["othersrv-other"]
    assert service["command"][:4] == ["othersrv", "launch", "--model-path", variant.model]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "othersrv"
    fake.write_text(f"""#!/bin/sh
[ "$1" = launch ] && [ "$2" = --model-path ] || exit 64
model="$3"; shift 3
exec {sys.executable} -m servelab.commands.sim --model "$model" --hardware L40S "$@"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    server = backends.start_server("local", variant, tmp_path)
    try:
        backends.wait_healthy(server, 30)
        assert verify(variant, log_path=server.log_path, url=server.url).status == "verified"
    finally:
        server.stop()


def test_run_with_an_unknown_variant_is_an_error_listing_the_known_ones(tmp_path, capsys):
    from servelab.cli import main

    profile = os.path.join(os.path.dirname(__file__), "data", "tiny.yaml")
    code = main(["run", "--profile", profile, "--target", "http://127.0.0.1:9", "--variant",
                 "bf61", "--db", str(tmp_path / "r.duckdb")])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown variant 'bf61'" in err and "known variants: awq_int4, bf16" in err


@pytest.mark.slow
def test_run_against_a_target_verifies_the_variant_and_flags_a_mismatch(tmp_path, capsys):
    """`servelab run --target URL --variant V [--log F]` judges the server from its /metrics (and
    log) after the run and records the verdict: the right variant is verified, a wrong one is
    flagged variant_mismatch."""
    import duckdb

    from servelab.cli import main

    variant = load_variant("bf16", environ={})
    server = backends.start_server("sim", variant, tmp_path / "logs", hardware="L40S")
    profile = os.path.join(os.path.dirname(__file__), "data", "tiny.yaml")
    db = tmp_path / "r.duckdb"
    try:
        backends.wait_healthy(server, 30)
        for name, run_id in (("bf16", "right"), ("fp8", "wrong")):
            code = main(["run", "--profile", profile, "--target", server.url, "--variant", name,
                         "--log", str(server.log_path), "--db", str(db), "--run-id", run_id,
                         "--quiet"])
            assert code == 0, capsys.readouterr()
    finally:
        server.stop()
    out = capsys.readouterr().out
    assert "verify bf16: VERIFIED" in out and "verify fp8: MISMATCH" in out
    con = duckdb.connect(str(db), read_only=True)
    rows = dict((r[0], r[1:]) for r in con.execute(
        "SELECT run_id, verification->>'status', flags FROM runs").fetchall())
    con.close()
    # (other flags, e.g. generator_saturated on a busy machine, may sit beside them)
    assert rows["right"][0] == "verified" and not {"unverified", "variant_mismatch"} & set(
        rows["right"][1] or [])
    assert rows["wrong"][0] == "mismatch" and "variant_mismatch" in rows["wrong"][1]
