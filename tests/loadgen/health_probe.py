"""Runs servelab's HealthMonitor in a gevent process, first idle, then with a greenlet that holds
the loop 19 ms out of every 21 ms (a generator that has become the bottleneck). The period is
no multiple of the monitor's own tick, so its lag samples cannot fall in step with the gaps
(8 ms of every 10 once gave a p99 of 4.96 ms, under the 5 ms limit).

Used by test_health.py in a subprocess (gevent's monkey-patching stays out of pytest): prints one
JSON line per phase with the client_health row the monitor produced.
"""
from gevent import monkey

monkey.patch_all()

import dataclasses  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

from servelab.loadgen.worker.health import HealthMonitor  # noqa: E402


class Rows:
    def record_health(self, row) -> None:
        pass


def hog(stop: list) -> None:
    while not stop:
        end = time.perf_counter() + 0.019
        while time.perf_counter() < end:
            pass
        gevent.sleep(0.002)


def main() -> None:
    monitor = HealthMonitor("run", "w0", Rows(), lambda: 0, lambda: 0)
    gevent.sleep(0.3)
    monitor.reset()
    gevent.sleep(1.5)
    print(json.dumps({"phase": "idle", **dataclasses.asdict(monitor.sample())}), flush=True)
    stop = []
    g = gevent.spawn(hog, stop)
    gevent.sleep(1.5)
    print(json.dumps({"phase": "busy", **dataclasses.asdict(monitor.sample())}), flush=True)
    stop.append(True)
    g.join()
    monitor.stop()


if __name__ == "__main__":
    main()
