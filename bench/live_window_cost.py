#!/usr/bin/env python
"""What the master's live window costs a second at 256 streams (issue 20: it runs in the event
loop that reads the streams, so its cost delays them). Simulated seconds of traffic, fed as the workers' batches come (four a second), and
the figures asked for as a run asks for them: the status line's headline every second, a series
point every ``STEP_S``, and one LLM-tab view a second. Every request streams 256 one-token chunks
11 ms apart after a 100 ms TTFT, so 256 streams finish about 87 requests (22 k chunks) a second.

Two CPU figures, in ms per simulated second: ``loop`` is the calling (event-loop) thread's own
CPU (``time.thread_time``: what delays the streams), ``all`` the process's (``process_time``:
every thread; the two differed when an in-memory DuckDB on a thread of its own computed the
figures, which this benchmark measured and which was taken out for its cost). The first ``--warm`` seconds are not counted (buckets fill up).

Usage: python bench/live_window_cost.py [--streams 256] [--seconds 30] [--warm 12]
"""
from __future__ import annotations

import argparse
import random
import time

from servelab.loadgen.master.live import LiveWindow

SLOS = {"chat": (300.0, 25.0, 60.0, None), "batch": (None, None, None, 4000.0)}
T0 = 1_700_000_000.0


def sample(rng: random.Random) -> tuple:
    """One finished request as a worker ships it (recorder._live_sample's tuple)."""
    ttft = rng.uniform(80.0, 120.0)
    offsets = [ttft + 11.0 * i + rng.uniform(-1.0, 1.0) for i in range(256)]
    return (rng.choice(("chat", "batch")), None, ttft, offsets[-1], 256, offsets, [1] * 256,
            None)


def run(streams: int, seconds: int, warm: int) -> dict:
    rng = random.Random(7)
    clock = [T0]
    live = LiveWindow(SLOS, clock=lambda: clock[0])
    per_s = streams / (0.1 + 0.011 * 255)            # requests finished per second
    pool = [sample(rng) for _ in range(64)]
    loop_ms = all_ms = 0.0
    for s in range(seconds):
        t_loop, t_all = time.thread_time(), time.process_time()
        for quarter in range(4):
            clock[0] = T0 + s + quarter / 4
            live.add([rng.choice(pool) for _ in range(round(per_s / 4))])
        clock[0] = T0 + s + 0.99
        live.tick()
        live.headline()
        live.view([])
        if s >= warm:
            loop_ms += 1000 * (time.thread_time() - t_loop)
            all_ms += 1000 * (time.process_time() - t_all)
    counted = seconds - warm
    fig = live.figures()
    return {"loop_ms_per_s": loop_ms / counted, "all_ms_per_s": all_ms / counted,
            "requests_per_s": fig["requests_per_s"], "itl_p99_ms": fig["itl_p99_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--warm", type=int, default=12)
    a = ap.parse_args()
    got = run(a.streams, a.seconds, a.warm)
    print(f"{a.streams} streams: {got['requests_per_s']:.0f} requests/s in the window, ITL p99 "
          f"{got['itl_p99_ms']:.2f} ms; live window CPU per second: event loop "
          f"{got['loop_ms_per_s']:.1f} ms, process {got['all_ms_per_s']:.1f} ms")


if __name__ == "__main__":
    main()
