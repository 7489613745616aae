"""``servelab run --workers auto``: how many Locust worker processes a plan needs on this host.

One process (``--workers 0``: Locust, the master and the writer together) reads up to
``USERS_PER_PROCESS`` streams within the tails a raw-socket client would see (``bench/tail.py``
on one core: ITL gap p99 within 20% of the reference's up to 384 streams at a 10 ms ITL; its
TTFT p99 7 ms above it there, within 4 ms at 256). Past that the plan's peak users are shared by
workers, one per core, with a core left for the master (and one for the simulator when servelab
starts it).
Where the cores are too few, the count stops at what they allow and says so: the run's
``generator_saturated`` flag then tells whether the generator kept up.
"""
from __future__ import annotations

import math
import os

USERS_PER_PROCESS = 384
# open loop: requests in flight ~ rate x E2E; the E2E of a token is a guess without a server
# (a 30 ms ITL is slow for a served model; the plan's max_in_flight, where set, decides instead)
GUESS_S_PER_TOKEN = 0.03
GUESS_FIXED_S = 1.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def peak_users(profile) -> int:
    """The most streams the plan keeps open at once (an estimate for open-loop plans)."""
    load = profile.load
    kind, plan = load.kind, load.plan
    if kind == "concurrency":
        return max(plan.levels)
    if kind == "ramp":
        return max(s.users for s in plan.stages)
    if plan.max_in_flight is not None:
        return plan.max_in_flight
    if kind == "rate":
        rate = max(plan.rates)
    else:   # trace: the busiest second of the replay
        seconds: dict[int, int] = {}
        for row in plan.rows:
            seconds[int(row.arrival_s)] = seconds.get(int(row.arrival_s), 0) + 1
        rate = max(seconds.values())
    tokens = max((_tokens(c) for c in profile.classes), default=256)
    return math.ceil(rate * (GUESS_FIXED_S + GUESS_S_PER_TOKEN * tokens))


def _tokens(cls) -> float:
    dist = cls.output_tokens
    if dist is None:
        return 256
    bound = dist.upper_bound()
    return bound if math.isfinite(bound) else 4096


def auto_workers(profile, starts_simulator: bool, cores: int | None = None) -> tuple[int, str]:
    """The worker count for ``profile`` and a sentence saying why."""
    cores = usable_cores() if cores is None else cores
    users = peak_users(profile)
    if users <= USERS_PER_PROCESS:
        return 0, (f"--workers auto: one process ({users} peak users, at most "
                   f"{USERS_PER_PROCESS} per process)")
    want = math.ceil(users / USERS_PER_PROCESS)
    room = max(1, cores - 1 - (1 if starts_simulator else 0))
    if want <= room:
        return want, (f"--workers auto: {want} workers ({users} peak users, at most "
                      f"{USERS_PER_PROCESS} each; {cores} cores)")
    return room, (f"--workers auto: {room} workers, fewer than the {want} that {users} peak "
                  f"users need at {USERS_PER_PROCESS} each: {cores} cores leave room for no "
                  "more (add hosts as workers, docs/loadgen.md; the run flags "
                  "generator_saturated if they fall behind)")
