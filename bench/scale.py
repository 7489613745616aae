#!/usr/bin/env python
"""servelab at scale: N Locust workers against the multi-process mock, at a stated user count.

The mock (``bench/calibration_server.py``, ``--mock-processes`` processes on one port through
SO_REUSEPORT) answers every stream with its first content chunk ``--ttft-ms`` after the request
and one every ``--itl-ms`` after that: the truth each figure is held against. ``servelab run
--workers N`` (``auto``: its own choice) drives ``--users`` closed-loop users through one
concurrency level (``--warmup`` + ``--hold``). Printed: rows stored of rows produced (every
worker's account), TTFT and ITL gap p50/p99 against the truth, output tokens/s, CPU per role
(the master, the workers — total and busiest —, the mock; percent of one core, sampled with
psutil over the measured window) and the run's flags. A role near 100% of a core (the master, a
worker) or the mock's processes near theirs is where the setup saturates.

``--metrics-body '{}'`` makes the mock's /metrics answer a page the Prometheus parser refuses
(the issue-19 case that lost rows); the default answers 404.

Usage: python bench/scale.py --users 640 --workers 2 [--mock-processes 2] [--hold 20]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import psutil

from servelab.core import procs
from tail import pinned   # bench/ is this script's folder, first on sys.path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


class RoleCpu:
    """CPU seconds per role (master, each worker, mock), sampled every 0.5 s with the time."""

    def __init__(self, run_pid: int, mock_pid: int):
        self.run, self.mock = psutil.Process(run_pid), psutil.Process(mock_pid)
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _role(self, p: psutil.Process) -> str | None:
        cmd = " ".join(p.cmdline())
        if "locust" not in cmd:
            return None
        return f"worker-{p.pid}" if "--worker" in cmd else "master"

    def _loop(self) -> None:
        seen: dict[str, float] = {}
        while not self._stop.is_set():
            for root, fixed in ((self.run, None), (self.mock, "mock")):
                try:
                    tree = [root] + root.children(recursive=True)
                except psutil.Error:
                    continue
                for p in tree:
                    try:
                        role = fixed or self._role(p)
                        if role is not None:
                            t = p.cpu_times()
                            seen[f"{role}:{p.pid}"] = t.user + t.system
                    except psutil.Error:
                        pass
            self.samples.append((time.time(), dict(seen)))
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def percent(self, t0: float, t1: float) -> dict[str, float]:
        """Percent of one core per process key over [t0, t1]."""
        ts = np.array([s[0] for s in self.samples])
        keys = {k for _, s in self.samples for k in s}
        out = {}
        for k in keys:
            cs = np.array([s.get(k, np.nan) for _, s in self.samples])
            ok = ~np.isnan(cs)
            if ok.sum() >= 2:
                used = np.interp(t1, ts[ok], cs[ok]) - np.interp(t0, ts[ok], cs[ok])
                out[k] = 100.0 * used / (t1 - t0)
        return out


def figures(db: Path) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        t0, t1 = con.execute("SELECT measure_start_unix, measure_end_unix FROM stages "
                             "ORDER BY stage DESC LIMIT 1").fetchone()
        produced, stored = con.execute("SELECT sum(produced), sum(stored) FROM "
                                       "run_workers").fetchone()
        rows = con.execute("SELECT ttft_ms, chunk_offsets_ms FROM requests WHERE NOT warmup "
                           "AND error_kind IS NULL").fetchall()
        errors = con.execute("SELECT count(*) FROM requests WHERE error_kind IS NOT NULL"
                             ).fetchone()[0]
        tokens = con.execute("SELECT sum(output_tokens) FROM requests WHERE NOT warmup"
                             ).fetchone()[0] or 0
        status, flags, notes = con.execute("SELECT status, flags, notes FROM runs").fetchone()
        table_rows = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    finally:
        con.close()
    ttft = np.array([r[0] for r in rows if r[0] is not None])
    gaps = np.concatenate([np.diff(np.asarray(r[1], float)) for r in rows if r[1] and
                           len(r[1]) > 1] or [np.zeros(0)])
    q = (lambda a, p: float(np.quantile(a, p)) if a.size else float("nan"))
    return {"t0": t0, "t1": t1, "produced": produced, "stored": stored, "rows": table_rows,
            "errors": errors, "ttft": (q(ttft, .5), q(ttft, .99)),
            "itl": (q(gaps, .5), q(gaps, .99)), "tokens_per_s": tokens / (t1 - t0),
            "status": status, "flags": flags or [], "notes": notes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, required=True)
    ap.add_argument("--workers", default="auto", help="a count, or auto")
    ap.add_argument("--mock-processes", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--hold", type=float, default=20.0)
    ap.add_argument("--metrics-body", default=None)
    ap.add_argument("--server-cores", default=None, help="taskset list for the mock")
    ap.add_argument("--client-cores", default=None, help="taskset list for servelab (its "
                    "--workers auto counts these cores)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="servelab-scale-"))
    ready = tmp / "mock.ready"
    cmd = [sys.executable, str(BENCH / "calibration_server.py"), "--port", "0", "--ready-file",
           str(ready), "--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms), "--processes",
           str(a.mock_processes)]
    cmd += ["--metrics-body", a.metrics_body] if a.metrics_body is not None else ["--no-metrics"]
    mock = procs.spawn("the mock server", pinned(a.server_cores, cmd), tmp / "mock.log",
                       ready_file=ready)
    url = mock.wait_ready(60)
    profile = tmp / "scale.yaml"
    profile.write_text(
        "name: scale_bench\ndescription: servelab at scale against the mock\nendpoint: chat\n"
        "model: auto\nsalt: false\nclasses:\n  - name: chat\n    prompt_tokens: 32\n"
        f"    output_tokens: {a.tokens}\nload:\n  concurrency: {{levels: [{a.users}], "
        f"warmup: {a.warmup:g}s, hold: {a.hold:g}s}}\n")
    db = tmp / "scale.duckdb"
    log = open(tmp / "run.log", "w")
    run = subprocess.Popen(pinned(a.client_cores, [
        sys.executable, "-m", "servelab.cli", "run", "--profile", str(profile), "--target", url,
        "--workers", str(a.workers), "--db", str(db), "--spool-dir", str(tmp / "spool"),
        "--quiet"]), stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT))
    cpu = RoleCpu(run.pid, mock.pid)
    try:
        code = run.wait(timeout=a.warmup + a.hold + 600)
    finally:
        cpu.stop()
        log.close()
        mock.stop()
    f = figures(db)
    report(a, f, cpu.percent(f["t0"], f["t1"]), code, tmp)
    return 0


def report(a, f: dict, pct: dict, code: int, tmp: Path) -> None:
    workers = {k: v for k, v in pct.items() if k.startswith("worker-")}
    master = sum(v for k, v in pct.items() if k.startswith("master"))
    mock = {k: v for k, v in pct.items() if k.startswith("mock")}
    chosen = next((line.strip() for line in (tmp / "run.log").read_text().splitlines()
                   if "--workers auto" in line), f"--workers {a.workers}")
    print(f"{a.users} users, {len(workers)} workers ({chosen}); mock: {a.mock_processes} "
          f"processes, TTFT {a.ttft_ms:g} ms, ITL {a.itl_ms:g} ms, {a.tokens} tokens; "
          f"{a.warmup:g} s warm-up + {a.hold:g} s measured; {os.cpu_count()} cores; "
          f"exit {code}, run {f['status']}\n")
    print(f"rows stored / produced   {f['stored']:,} / {f['produced']:,} (in the table: "
          f"{f['rows']:,}; errors {f['errors']:,})")
    print(f"TTFT p50 / p99 ms        {f['ttft'][0]:.1f} / {f['ttft'][1]:.1f} (truth "
          f"{a.ttft_ms:g})")
    print(f"ITL gap p50 / p99 ms     {f['itl'][0]:.1f} / {f['itl'][1]:.1f} (truth "
          f"{a.itl_ms:g})")
    print(f"output tokens/s          {f['tokens_per_s']:,.0f} (truth at full speed "
          f"{a.users * 1000 / (a.ttft_ms + a.itl_ms * (a.tokens - 1)) * a.tokens:,.0f})")
    busiest = max(workers.values(), default=0.0)
    print(f"CPU, % of one core       master {master:.0f}; workers {sum(workers.values()):.0f} "
          f"in all, busiest {busiest:.0f}; mock {sum(mock.values()):.0f} over "
          f"{len(mock)} processes (busiest {max(mock.values(), default=0):.0f})")
    print(f"flags                    {', '.join(f['flags']) or 'none'}")
    if f["notes"]:
        print(f"notes                    {f['notes'][:400]}")
    print(f"\nfiles: {tmp}")


if __name__ == "__main__":
    raise SystemExit(main())
