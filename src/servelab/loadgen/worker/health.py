"""The generator watching itself: CPU and gevent loop lag, sampled on every worker.

A probe greenlet sleeps ``PROBE_S`` and measures how late it wakes up: any greenlet that holds
the loop (a big JSON encode, a slow prompt build, CPU saturation) shows up as lag, and the same
lag sits in every chunk timestamp taken meanwhile. Once a second the worst and the 99th
percentile lag of the interval, the process CPU, in-flight requests, the open-loop backlog and
the RSS become one ``client_health`` row.

Lag has two causes that need opposite remedies: this process doing too much (add workers) or
other processes holding the cores it needs (a quieter host). The row also gets what tells them
apart: the process's involuntary context switches per second and the host's busy CPU, steal
time, 1-minute load and runnable threads per core (``store/runs.py`` judges them).
"""
from __future__ import annotations

import os
import time

import gevent
import psutil

from servelab.core.quantiles import quantile_cont
from servelab.loadgen.client.clock import now_unix
from servelab.store.rows import HealthRow

PROBE_S = 0.01
INTERVAL_S = 1.0


class HealthMonitor:
    def __init__(self, run_id: str, worker: str, recorder, in_flight, backlog):
        self.run_id = run_id
        self.worker = worker
        self.recorder = recorder
        self.in_flight = in_flight   # callables, read once per sample
        self.backlog = backlog
        self._lags: list[float] = []
        self._proc = psutil.Process()
        self._cores = psutil.cpu_count() or 1
        self._prime()
        self._greenlets = [gevent.spawn(self._probe), gevent.spawn(self._sample_loop)]

    def _probe(self) -> None:
        # On an absolute schedule: lag = how late each wake-up is against its due time.
        due = time.perf_counter()
        while True:
            due += PROBE_S
            gevent.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            self._lags.append(now - due)
            if now - due > PROBE_S:
                due = now  # after a long stall, do not count the missed wake-ups again

    def reset(self) -> None:
        """Forget the lag seen so far (the set-up before the first stage is not the run)."""
        self._lags = []
        self._prime()

    def _prime(self) -> None:
        # Each sample reports the interval since the previous one (psutil's None-interval calls).
        self._proc.cpu_percent(None)
        psutil.cpu_times_percent(None)
        self._switches = self._proc.num_ctx_switches().involuntary
        self._switches_t = time.monotonic()

    def _host(self) -> dict:
        """Involuntary switches/s of this process and the host's load over the interval."""
        now, switches = time.monotonic(), self._proc.num_ctx_switches().involuntary
        per_s = (switches - self._switches) / max(now - self._switches_t, 1e-3)
        self._switches, self._switches_t = switches, now
        t = psutil.cpu_times_percent(None)
        runnable = _runnable_others()
        idle = t.idle + getattr(t, "iowait", 0.0)
        return {"involuntary_switches_per_s": per_s,
                "host_cpu_percent": max(0.0, 100.0 - idle),
                "host_steal_percent": getattr(t, "steal", None),
                "host_load_per_core": os.getloadavg()[0] / self._cores,
                "host_runnable_per_core": None if runnable is None else runnable / self._cores}

    def sample(self) -> HealthRow:
        lags, self._lags = self._lags, []
        lags = [max(0.0, x) for x in lags]
        mem = self._proc.memory_info().rss
        row = HealthRow(self.run_id, self.worker, now_unix(),
                        cpu_percent=self._proc.cpu_percent(None),
                        loop_lag_ms=max(lags) * 1000.0 if lags else 0.0,
                        loop_lag_p99_ms=quantile_cont(lags, 0.99) * 1000.0 if lags else 0.0,
                        in_flight=self.in_flight(), backlog=self.backlog(), rss_mb=mem / 1e6,
                        **self._host())
        self.recorder.record_health(row)
        return row

    def _sample_loop(self) -> None:
        next_t = time.perf_counter() + INTERVAL_S
        while True:
            gevent.sleep(max(0.0, next_t - time.perf_counter()))
            next_t += INTERVAL_S
            self.sample()

    def stop(self) -> None:
        for g in self._greenlets:
            g.kill(block=False)


def _runnable_others() -> float | None:
    """Threads runnable right now besides this one (/proc/loadavg's 'running/total' field)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            running = int(fh.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):   # not Linux: the load average still tells
        return None
    return float(max(0, running - 1))
