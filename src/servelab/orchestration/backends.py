"""Bring one variant's server up and down: the simulator, ``vllm serve``, Docker Compose, or a URL.

Every backend gives a ``RunningServer``: its base URL, the file its log goes to (what verify reads)
and ``stop()``. Waiting for ``/health`` and resetting the prefix cache are the same for all.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.orchestration import compose
from servelab.core.paths import project_root
from servelab.specs.variants import Variant

BACKENDS = ("sim", "predict", "local", "compose", "external")


@dataclass
class RunningServer:
    variant: Variant
    backend: str
    url: str
    log_path: Path | None
    processes: list[subprocess.Popen] = field(default_factory=list)
    compose_services: list[str] = field(default_factory=list)
    _logs: list = field(default_factory=list, repr=False)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def refresh_log(self) -> None:
        """Compose keeps logs in the engine: copy them to log_path (process logs are live)."""
        if self.compose_services and self.log_path is not None:
            done = _docker_compose(["--profile", self.variant.name, "logs", "--no-color",
                                    "--no-log-prefix", *self.compose_services], check=False)
            self.log_path.write_text(done.stdout + done.stderr, encoding="utf-8")

    def stop(self, timeout_s: float = 30.0) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for handle in self._logs:
            handle.close()
        self._logs.clear()
        if self.compose_services:
            self.refresh_log()
            _docker_compose(["--profile", self.variant.name, "stop", *self.compose_services],
                            check=False)
            _docker_compose(["--profile", self.variant.name, "rm", "-f", *self.compose_services],
                            check=False)
            self.compose_services = []


def _log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def wait_healthy(server: RunningServer, timeout_s: float) -> None:
    """Poll ``/health`` until it answers 200; fail early when the server process died."""
    deadline = time.monotonic() + timeout_s
    url = server.url.rstrip("/") + "/health"
    while True:
        if server.processes and not server.alive():
            code = next(p.returncode for p in server.processes if p.poll() is not None)
            raise ServelabError(f"{server.variant.name}: the server exited ({code}) before it was "
                                f"healthy; its log ({server.log_path}) ends:\n"
                                f"{_log_tail(server.log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            server.refresh_log()
            raise ServelabError(f"{server.variant.name}: {url} not healthy after {timeout_s:.0f} s "
                                f"(raise --startup-timeout); log tail:\n{_log_tail(server.log_path)}")
        time.sleep(0.2)


def reset_prefix_cache(url: str) -> bool:
    """POST /reset_prefix_cache; False where the server does not offer it (vLLM and the simulator
    expose it with VLLM_SERVER_DEV_MODE=1; most proxies do not). vLLM answers 200 even when it
    could not reset because requests still hold blocks: call it while the server is idle."""
    request = urllib.request.Request(url.rstrip("/") + "/reset_prefix_cache", data=b"",
                                      method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError):
        return False


def start_sim(variant: Variant, hardware: str, log_path: Path, seed: int = 0,
              extra_args: list[str] | None = None, ready_timeout_s: float = 60.0) -> RunningServer:
    """``servelab sim --variant X --hardware H --port 0 --ready-file F`` as a child process."""
    ready = log_path.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    command = [sys.executable, "-m", "servelab.commands.sim", "--variant", str(variant.path),
               "--hardware", hardware, "--host", "127.0.0.1", "--port", "0",
               "--ready-file", str(ready), "--seed", str(seed), *(extra_args or [])]
    handle = open(log_path, "w", encoding="utf-8")
    # Dev mode adds /reset_prefix_cache, as for `vllm serve` (start_local) and Compose.
    env = dict(os.environ, SERVELAB_HOME=str(project_root()), PYTHONUNBUFFERED="1",
               VLLM_SERVER_DEV_MODE="1")
    proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    server = RunningServer(variant, "sim", "", log_path, [proc], _logs=[handle])
    deadline = time.monotonic() + ready_timeout_s
    while not ready.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise ServelabError(f"{variant.name}: the simulator did not start "
                                f"({'exit ' + str(proc.returncode) if proc.returncode is not None else 'timeout'}); "
                                f"its log ({log_path}) ends:\n{_log_tail(log_path)}")
        time.sleep(0.05)
    server.url = ready.read_text().strip()
    return server


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_local(variant: Variant, log_path: Path, port: int | None = None) -> RunningServer:
    """``vllm serve`` with the variant's arguments as a child process (GPU host, no Docker)."""
    if variant.instances > 1:
        raise ServelabError(f"{variant.name}: {variant.instances} instances need a load balancer; "
                            f"use --backend compose (nginx), or start them behind your own "
                            f"balancer and use --backend external --url URL")
    vllm = shutil.which("vllm")
    if vllm is None:
        raise ServelabError("`vllm` is not installed here: pip install 'servelab[vllm]' on a GPU "
                            "host, or use --backend compose or --backend sim")
    port = port or _free_port()
    command = [vllm, "serve", *variant.vllm_serve_args(port=port, host="127.0.0.1")]
    handle = open(log_path, "w", encoding="utf-8")
    # Dev mode adds /reset_prefix_cache, so one variant's cache never favours the next run.
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    return RunningServer(variant, "local", f"http://127.0.0.1:{port}", log_path, [proc],
                         _logs=[handle])


def _docker_compose(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    docker = shutil.which("docker")
    if docker is None:
        raise ServelabError("`docker` is not installed here; --backend compose needs Docker with "
                            "the NVIDIA container toolkit (or use --backend local / sim)")
    done = subprocess.run([docker, "compose", *args], cwd=project_root(), capture_output=True,
                          text=True)
    if check and done.returncode != 0:
        raise ServelabError(f"docker compose {' '.join(args)} failed ({done.returncode}): "
                            f"{done.stderr.strip()[-800:]}")
    return done


def start_compose(variant: Variant, log_path: Path) -> RunningServer:
    """``docker compose --profile X up -d`` of the variant's server services (not its loadgen)."""
    problems = compose.check()
    if problems:
        raise ServelabError("docker-compose.yml drifted from servers/variants/; run "
                            "`servelab compose generate` first")
    services = compose.server_services(variant)
    _docker_compose(["--profile", variant.name, "up", "-d", *services])
    port = os.environ.get("VLLM_PORT", str(compose.VLLM_PORT))
    return RunningServer(variant, "compose", f"http://127.0.0.1:{port}", log_path,
                         compose_services=services)


def start_server(backend: str, variant: Variant, log_dir: Path, *, hardware: str | None = None,
                 url: str | None = None, seed: int = 0, sim_args: list[str] | None = None,
                 suffix: str = "") -> RunningServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{variant.name}{suffix}.log"
    if backend == "sim":
        return start_sim(variant, hardware or "L40S", log_path, seed, sim_args)
    if backend == "local":
        return start_local(variant, log_path)
    if backend == "compose":
        return start_compose(variant, log_path)
    if backend == "external":
        if not url:
            raise ServelabError("--backend external needs --url URL (the running server)")
        return RunningServer(variant, "external", url.rstrip("/"), None)
    raise ServelabError(f"--backend {backend}: allowed {', '.join(BACKENDS)}")
