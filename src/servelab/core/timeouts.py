"""Every timeout default in one place, so the CLI, the Locust options, the runner and the matrix
say the same thing. Seconds throughout."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTimeouts:
    """Per-request limits of the load generator (a request over one is an error row)."""
    connect: float = 10.0
    first_token: float = 300.0
    between_chunks: float = 60.0
    total: float = 1800.0


REQUEST = RequestTimeouts()
DRAIN_S = 60.0            # in-flight requests' time to finish at the end of a run
SIM_READY_S = 120.0       # a simulator child writing its ready file
SERVER_STARTUP_S = 1800.0  # a real `vllm serve` (weights, compile, CUDA graphs) becoming healthy
WORKERS_READY_S = 120.0   # Locust workers connecting to their master
MASTER_EXIT_S = 180.0     # the master draining and writing its record after Ctrl-C
STOP_GRACE_S = 15.0       # SIGTERM to SIGKILL for any child
HTTP_PROBE_S = 10.0       # one probe of a server (/v1/models, /metrics, /tokenize)
# The load plan's own timing, which the real-time driver (loadgen.shapes) and predict's copy of
# it (sim.engine.virtual_stages) must share to give the same stage windows.
REACH_POLL_S = 0.05       # a level's user count is checked this often until all users run
SPAWN_RATE_CAP = 100.0    # the default spawn rate: the level, at most this many users/s per worker
OPEN_LEAD_S = 1.0         # open-loop schedules start this long after they are announced
