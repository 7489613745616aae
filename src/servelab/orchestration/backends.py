"""Bring one variant's server up and down: the simulator, the server itself (``vllm serve``),
Docker Compose, or a URL.

Every backend gives a ``RunningServer``: its base URL, the file its log goes to (what verify reads)
and ``stop()``. What differs between server kinds (the command, the health path, the environment
that enables reset_prefix_cache) comes from the variant's kind (``specs.server_kinds``). Given the
run's OTLP port, each server sends its per-request spans there (``otlp.py``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core import procs
from servelab.core.errors import ServelabError
from servelab.core.paths import project_root
from servelab.core.timeouts import HTTP_PROBE_S, SERVER_STARTUP_S, SIM_READY_S, STOP_GRACE_S
from servelab.orchestration import compose, otlp
from servelab.specs.variants import Variant

BACKENDS = ("sim", "predict", "local", "compose", "external")


@dataclass
class RunningServer:
    variant: Variant
    backend: str
    url: str
    log_path: Path | None
    children: list[procs.Child] = field(default_factory=list)
    compose_services: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return all(c.alive() for c in self.children)

    def refresh_log(self) -> None:
        """Compose keeps logs in the engine: copy them to log_path (process logs are live)."""
        if self.compose_services and self.log_path is not None:
            done = _docker_compose(["--profile", self.variant.name, "logs", "--no-color",
                                    "--no-log-prefix", *self.compose_services], check=False)
            self.log_path.write_text(done.stdout + done.stderr, encoding="utf-8")

    def stop(self, timeout_s: float = STOP_GRACE_S) -> None:
        for child in self.children:
            child.stop(timeout_s)
        if self.compose_services:
            self.refresh_log()
            _docker_compose(["--profile", self.variant.name, "stop", *self.compose_services],
                            check=False)
            _docker_compose(["--profile", self.variant.name, "rm", "-f", *self.compose_services],
                            check=False)
            self.compose_services = []


HEALTH_PROBE_S = 5.0          # one GET of the health route
HEALTH_MAX_BYTES = 64 << 10   # vLLM and SGLang answer an empty body


def probe_health(url: str, timeout_s: float = HEALTH_PROBE_S) -> tuple[str, str]:
    """(outcome, what came back) of one GET of a health route: "ok" for a 2xx that is not an
    HTML page (a 200 login page is a proxy's answer, not the server's), else the named outcome
    (``core.bounded_http.OUTCOMES``)."""
    from servelab.core import bounded_http

    answer = bounded_http.fetch(url, "", deadline_s=timeout_s, max_bytes=HEALTH_MAX_BYTES)
    if answer.ok and bounded_http.sniff(answer.body) == "html":
        return "html_page", f"{answer.seen()}: {bounded_http.excerpt(answer.body)}"
    return answer.outcome, answer.seen()


def wait_healthy(server: RunningServer, timeout_s: float = SERVER_STARTUP_S) -> None:
    """Poll the kind's health path until it answers 200; fail early when the server died. The
    error says what the health route last answered (a 503 while loading, an HTML page...)."""
    from servelab.core import bounded_http

    deadline = time.monotonic() + timeout_s
    url = server.url.rstrip("/") + server.variant.kind.health_path
    last = ("unreachable", "nothing yet")
    while True:
        dead = next((c for c in server.children if not c.alive()), None)
        if dead is not None:
            raise ServelabError(f"{server.variant.name}: the server exited ({dead.returncode}) "
                                f"before it was healthy; its log ({server.log_path}) ends:\n"
                                f"{procs.log_tail(server.log_path)}")
        last = probe_health(url, max(0.5, min(HEALTH_PROBE_S, deadline - time.monotonic())))
        if last[0] == "ok":
            return
        if time.monotonic() > deadline:
            server.refresh_log()
            raise ServelabError(f"{server.variant.name}: {url} not healthy after {timeout_s:.0f} s "
                                f"(raise --startup-timeout); its last answer "
                                f"{bounded_http.describe(last[0])} ({last[0]}: {last[1]}); log "
                                f"tail:\n{procs.log_tail(server.log_path)}")
        time.sleep(0.2)


def reset_prefix_cache(url: str, timeout_s: float = HTTP_PROBE_S,
                       path: str = "/reset_prefix_cache") -> bool:
    """POST ``path`` (the kind's ``reset_prefix_cache_path``); False where the server does not
    offer it (vLLM and the simulator expose it with VLLM_SERVER_DEV_MODE=1; most proxies do not).
    vLLM answers 200 even when it could not reset because requests still hold blocks: call it
    while the server is idle."""
    request = urllib.request.Request(url.rstrip("/") + path, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError):
        return False


def start_sim(variant: Variant, hardware: str, log_path: Path, seed: int = 0,
              extra_args: list[str] | None = None,
              ready_timeout_s: float = SIM_READY_S, otlp_port: int | None = None) -> RunningServer:
    """``servelab sim --variant X --hardware H --port 0 --ready-file F`` as a child process."""
    command = [sys.executable, "-m", "servelab.commands.sim", "--variant", str(variant.path),
               "--hardware", hardware, "--host", "127.0.0.1", "--port", "0",
               "--ready-file", str(log_path.with_suffix(".ready")), "--seed", str(seed),
               *(extra_args or [])]
    # the simulator sends vLLM's spans whatever the variant's kind (it speaks vLLM's dialect)
    if otlp_port and otlp.FLAG not in command:
        command += [otlp.FLAG, otlp.endpoint(otlp_port)]
    # Dev mode adds /reset_prefix_cache, as for `vllm serve` (start_local) and Compose; the
    # simulator speaks vLLM's dialect, so it reads vLLM's switch whatever the variant's kind.
    env = dict(os.environ, SERVELAB_HOME=str(project_root()), PYTHONUNBUFFERED="1",
               VLLM_SERVER_DEV_MODE="1", **otlp.SERVER_ENV)
    child = procs.spawn(f"{variant.name}: the simulator", command, log_path, env=env,
                        ready_file=log_path.with_suffix(".ready"))
    url = child.wait_ready(ready_timeout_s)
    return RunningServer(variant, "sim", url, log_path, [child])


def start_local(variant: Variant, log_path: Path, port: int | None = None,
                otlp_port: int | None = None) -> RunningServer:
    """The variant's server (``vllm serve MODEL ARGS``) as a child process (GPU host, no Docker);
    with ``otlp_port``, sending its spans to the run's receiver on this host's loopback."""
    if variant.instances > 1:
        raise ServelabError(f"{variant.name}: {variant.instances} instances need a load balancer; "
                            f"use --backend compose (nginx), or start them behind your own "
                            f"balancer and use --backend external --url URL")
    kind = variant.kind
    executable = shutil.which(kind.command[0])
    if executable is None:
        raise ServelabError(f"`{kind.command[0]}` is not installed here: {kind.install_hint}, "
                            f"or use --backend compose or --backend sim")
    port = port or procs.free_port()
    spans = otlp.server_args(variant, otlp.endpoint(otlp_port) if otlp_port else None)
    command = [executable, *kind.command[1:], *variant.server_args(port=port, host="127.0.0.1"),
               *spans]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **kind.dev_env,
               **(otlp.server_env(kind) if spans else {}))
    child = procs.spawn(f"{variant.name}: {kind.label}", command, log_path, env=env)
    return RunningServer(variant, "local", f"http://127.0.0.1:{port}", log_path, [child])


def _docker_compose(args: list[str], check: bool = True,
                    env: dict | None = None) -> subprocess.CompletedProcess:
    docker = shutil.which("docker")
    if docker is None:
        raise ServelabError("`docker` is not installed here; --backend compose needs Docker with "
                            "the NVIDIA container toolkit (or use --backend local / sim)")
    done = subprocess.run([docker, "compose", *args], cwd=project_root(), capture_output=True,
                          text=True, env=None if env is None else dict(os.environ, **env))
    if check and done.returncode != 0:
        raise ServelabError(f"docker compose {' '.join(args)} failed ({done.returncode}): "
                            f"{done.stderr.strip()[-800:]}")
    return done


def _bridge_gateway() -> str | None:
    """The host's address on Docker's default bridge: where ``host-gateway`` leads."""
    try:
        done = subprocess.run(["docker", "network", "inspect", "bridge", "--format",
                               "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.split() or [None])[0] if done.returncode == 0 else None


def start_compose(variant: Variant, log_path: Path, otlp_port: int | None = None) -> RunningServer:
    """``docker compose --profile X up -d`` of the variant's server services (not its loadgen).

    The run is this host's, not the loadgen service's: with ``otlp_port`` the server sends its
    spans to this host (``host.docker.internal``, the host gateway); they arrive only when the
    run's receiver listens where a container reaches it (``SERVELAB_OTLP_HOST``, e.g. the Docker
    bridge's address 172.17.0.1), never by default."""
    problems = compose.check()
    if problems:
        raise ServelabError("docker-compose.yml drifted from servers/variants/; run "
                            "`servelab compose generate` first")
    services = compose.server_services(variant)
    env = None
    if otlp_port and otlp.sends_spans(variant):
        env = {otlp.ENDPOINT_ENV: otlp.endpoint(otlp_port, compose.HOST_GATEWAY)}
        if not os.environ.get(otlp.HOST_ENV):
            print(f"servelab: {variant.name}'s spans reach this host's run only with "
                  f"{otlp.HOST_ENV}={_bridge_gateway() or '<the Docker bridge address>'} (the "
                  f"run's receiver listens on 127.0.0.1 otherwise, out of the containers' "
                  f"reach); the run goes on without them", flush=True)
    _docker_compose(["--profile", variant.name, "up", "-d", *services], env=env)
    port = os.environ.get(compose.PORT_ENV, str(compose.VLLM_PORT))
    return RunningServer(variant, "compose", f"http://127.0.0.1:{port}", log_path,
                         compose_services=services)


def start_server(backend: str, variant: Variant, log_dir: Path, *, hardware: str | None = None,
                 url: str | None = None, seed: int = 0, sim_args: list[str] | None = None,
                 suffix: str = "", otlp_port: int | None = None) -> RunningServer:
    """``otlp_port``: the run's span receiver (picked before the server starts), or None."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{variant.name}{suffix}.log"
    if backend == "sim":
        return start_sim(variant, hardware or "L40S", log_path, seed, sim_args,
                         otlp_port=otlp_port)
    if backend == "local":
        return start_local(variant, log_path, otlp_port=otlp_port)
    if backend == "compose":
        return start_compose(variant, log_path, otlp_port)
    if backend == "external":
        if not url:
            raise ServelabError("--backend external needs --url URL (the running server)")
        return RunningServer(variant, "external", url.rstrip("/"), None)
    raise ServelabError(f"--backend {backend}: allowed {', '.join(BACKENDS)}")
