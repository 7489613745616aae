#!/usr/bin/env python
"""servelab's latency tails against a raw-socket reference, side by side, HEAD and earlier commits.

The yardstick is ``bench/calibration_server.py`` (first content chunk ``--ttft-ms`` after the
request, then one every ``--itl-ms``, whatever the load; ``--mock-processes`` processes on one
port through SO_REUSEPORT) pinned to ``--server-cores``. On ``--client-cores``, at each level in
turn: ``bench/reference_client.py`` (raw sockets, no HTTP library), then ``servelab run
--workers 0`` (the default one-process mode: Locust, the master, the writer and the web API in
one process) of this checkout and of each ``--commit`` (a ``git worktree`` of that commit, run
from its own source), the checkouts taking turns at going first from one level to the next
(repeat a level, ``--levels 256,256,384,384``, to measure each in every place). Each is
``--warmup`` s of warm-up and ``--hold`` s measured.

Per level and client: TTFT p99, ITL gap p99 (between consecutive content chunks of a stream),
CPU per content chunk in the window (the whole process tree, sampled with psutil, the same way
for every client), and whether servelab flagged the run ``generator_saturated``. The check the
load generator is held to (issue 19): TTFT p99 within 3 ms of the reference's, ITL gap p99
within 20%, CPU per chunk at most 1.1x at 256 streams and above, no saturation flag at 256.
The machine is shared: compare the columns of one run, and repeat to see the noise.

With ``--commit HEAD`` (or ``--home HEAD=DIR``) the working tree is the column "tree" and the
committed code "HEAD".

Usage: python bench/tail.py [--levels 128,256,384] [--commit 958f075 | --home NAME=DIR ...]
       [--no-tree] [--warmup 5]
       [--hold 20] [--server-cores 0] [--client-cores 1] [--metrics-body '{}']
"""
from __future__ import annotations

import argparse
import json
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
from servelab.core.quantiles import quantile_cont

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


class TreeCpu:
    """CPU seconds of a process and its children, sampled every 0.2 s with the time, so the CPU
    of any window can be read afterwards (the window is known only from the run's database)."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        seen: dict[int, float] = {}
        while not self._stop.is_set():
            try:
                for p in [self.root] + self.root.children(recursive=True):
                    try:
                        t = p.cpu_times()
                        seen[p.pid] = t.user + t.system
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            self.samples.append((time.time(), sum(seen.values())))
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> float:
        ts, cs = zip(*self.samples)
        return float(np.interp(t1, ts, cs) - np.interp(t0, ts, cs))


def p99(values) -> float | None:
    return quantile_cont(values, 0.99) if len(values) else None


def pinned(cores: str | None, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cores] + cmd if cores else cmd


def start_mock(tmp: Path, a) -> tuple[procs.Child, str]:
    ready = tmp / "mock.ready"
    cmd = [sys.executable, str(BENCH / "calibration_server.py"), "--port", "0", "--ready-file",
           str(ready), "--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms),
           "--processes", str(a.mock_processes)]
    cmd += ["--metrics-body", a.metrics_body] if a.metrics_body is not None else ["--no-metrics"]
    child = procs.spawn("the mock server", pinned(a.server_cores, cmd), tmp / "mock.log",
                        ready_file=ready)
    return child, child.wait_ready(60)


def run_reference(url: str, streams: int, a, tmp: Path) -> dict:
    out = tmp / f"ref-{streams}.json"
    with open(out, "w") as f:
        subprocess.run(pinned(a.client_cores, [
            sys.executable, str(BENCH / "reference_client.py"), "--url", url, "--streams",
            str(streams), "--warmup", str(a.warmup), "--hold", str(a.hold), "--tokens",
            str(a.tokens)]), stdout=f, check=True, timeout=a.warmup + a.hold + 120)
    r = json.loads(out.read_text())
    return {"ttft_p99": p99(list(r["ttft_ms"].values())), "itl_p99": p99(r["itl_ms"]),
            "us_per_chunk": r["us_per_chunk"], "requests": r["requests"], "saturated": None}


def worktree(commit: str, tmp: Path) -> Path:
    path = tmp / f"wt-{commit}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path),
                    commit], check=True, capture_output=True)
    return path


def run_servelab(url: str, streams: int, a, tmp: Path, home: Path, name: str) -> dict:
    profile = tmp / f"{name}-{streams}.yaml"
    profile.write_text(
        "name: tail_bench\ndescription: the load generator's tails against a reference\n"
        "endpoint: chat\nmodel: auto\nsalt: false\nclasses:\n  - name: chat\n"
        f"    prompt_tokens: 32\n    output_tokens: {a.tokens}\nload:\n  concurrency: "
        f"{{levels: [{streams}], warmup: {a.warmup:g}s, hold: {a.hold:g}s}}\n")
    db = tmp / f"{name}-{streams}.duckdb"
    # the checkout's own source first; what PYTHONPATH held (its dependencies) after it
    path = os.pathsep.join(p for p in (str(home / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, SERVELAB_HOME=str(home), PYTHONUNBUFFERED="1")
    cmd = pinned(a.client_cores, [sys.executable, "-m", "servelab.cli", "run", "--profile",
                                  str(profile), "--target", url, "--workers", "0", "--db",
                                  str(db), "--spool-dir", str(tmp / "spool"), "--quiet"])
    log = open(tmp / f"{name}-{streams}.log", "w")
    proc = subprocess.Popen(cmd, env=env, cwd=str(home), stdout=log, stderr=subprocess.STDOUT)
    cpu = TreeCpu(proc.pid)
    try:
        proc.wait(timeout=a.warmup + a.hold + 180)
    finally:
        cpu.stop()
        log.close()
    return servelab_figures(db, cpu)


def servelab_figures(db: Path, cpu: TreeCpu) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        t0, t1 = con.execute("SELECT measure_start_unix, measure_end_unix FROM stages "
                             "ORDER BY stage DESC LIMIT 1").fetchone()
        rows = con.execute("SELECT ttft_ms, sent_unix, chunk_offsets_ms FROM requests WHERE NOT "
                           "warmup AND error_kind IS NULL").fetchall()
        flags = con.execute("SELECT flags FROM runs").fetchone()[0] or []
    finally:
        con.close()
    ttft = [r[0] for r in rows if r[0] is not None]
    gaps = np.concatenate([np.diff(np.asarray(r[2], dtype=float)) for r in rows
                           if r[2] and len(r[2]) > 1] or [np.zeros(0)])
    # every chunk read in the window counts (warm-up requests' too), as the reference counts
    return {"ttft_p99": p99(ttft), "itl_p99": p99(gaps), "requests": len(rows),
            "us_per_chunk": 1e6 * cpu.between(t0, t1) / max(_window_chunks(db, t0, t1), 1),
            "saturated": "generator_saturated" in flags}


def _window_chunks(db: Path, t0: float, t1: float) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM (SELECT sent_unix + unnest(chunk_offsets_ms) "
                           "/ 1000 AS t FROM requests) WHERE t >= ? AND t < ?",
                           [t0, t1]).fetchone()[0]
    finally:
        con.close()


def table(levels: list[int], results: list[dict], names: list[str]) -> list[str]:
    """One line per entry of ``levels`` (a level given twice is measured twice: the noise)."""
    def f(v, d=1):
        return "-" if v is None else f"{v:.{d}f}"

    others = names[1:]
    lines = ["streams | ITL gap p99 ms: " + " / ".join(names)
             + " | TTFT p99 ms ref, then minus ref: " + " / ".join(others)
             + " | CPU us/chunk: " + " / ".join(names)
             + " | saturated: " + " / ".join(others)]
    for c, r in zip(levels, results):
        ref = r["ref"]
        lines.append(" | ".join([
            str(c), " / ".join(f(r[n]["itl_p99"], 2) for n in names),
            f(ref["ttft_p99"]) + ", " + " / ".join(
                f(r[n]["ttft_p99"] - ref["ttft_p99"]) if r[n]["ttft_p99"] is not None
                and ref["ttft_p99"] is not None else "-" for n in others),
            " / ".join(f(r[n]["us_per_chunk"]) for n in names),
            " / ".join("yes" if r[n]["saturated"] else "-" for n in others)]))
    lines.append("")
    lines.append("ratios to the reference (ITL gap p99, CPU per chunk); check: TTFT p99 <= ref "
                 "+ 3 ms, ITL p99 <= 1.2x, CPU <= 1.1x from 256 streams, unflagged at 256")
    for c, r in zip(levels, results):
        ref = r["ref"]
        cells = []
        for n in others:
            s = r[n]
            itl = s["itl_p99"] / ref["itl_p99"] if s["itl_p99"] and ref["itl_p99"] else None
            cpu = s["us_per_chunk"] / ref["us_per_chunk"] if ref["us_per_chunk"] else None
            ok = (s["ttft_p99"] is not None and s["ttft_p99"] - ref["ttft_p99"] <= 3.0
                  and itl is not None and itl <= 1.2
                  and (c < 256 or (cpu is not None and cpu <= 1.1))
                  and not (c == 256 and s["saturated"]))
            cells.append(f"{n}: ITL {f(itl, 2)}x, CPU {f(cpu, 2)}x "
                         f"{'holds' if ok else 'MISSES'}")
        lines.append(f"{c}: " + "; ".join(cells))
    return lines + repeat_medians(levels, results, others)


def repeat_medians(levels: list[int], results: list[dict], others: list[str]) -> list[str]:
    """For a level measured more than once: each checkout's median, over the repeats, of its
    ratios to the reference measured beside it and of its TTFT p99 over the reference's, held to
    the same check (one row on this shared machine moves by more than a tenth)."""
    rows: dict[int, list[dict]] = {}
    for c, r in zip(levels, results):
        rows.setdefault(c, []).append(r)
    out = []
    for c, rs in rows.items():
        if len(rs) < 2:
            continue
        cells = []
        for n in others:
            ttft = median(r[n]["ttft_p99"] - r["ref"]["ttft_p99"] for r in rs
                          if r[n]["ttft_p99"] is not None and r["ref"]["ttft_p99"] is not None)
            itl = median(r[n]["itl_p99"] / r["ref"]["itl_p99"] for r in rs
                         if r[n]["itl_p99"] and r["ref"]["itl_p99"])
            cpu = median(r[n]["us_per_chunk"] / r["ref"]["us_per_chunk"] for r in rs
                         if r["ref"]["us_per_chunk"])
            flagged = sum(bool(r[n]["saturated"]) for r in rs)
            ok = (ttft <= 3.0 and itl <= 1.2 and (c < 256 or cpu <= 1.1)
                  and not (c == 256 and flagged))
            cells.append(f"{n}: TTFT {ttft:+.1f} ms, ITL {itl:.2f}x, CPU {cpu:.2f}x, flagged "
                         f"{flagged} {'holds' if ok else 'MISSES'}")
        out.append(f"{c} (median of {len(rs)}): " + "; ".join(cells))
    return ["", "medians over the repeats of a level"] + out if out else []


def median(values) -> float:
    return quantile_cont(list(values), 0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="128,256,384")
    ap.add_argument("--commit", action="append", default=[],
                    help="an earlier commit to measure beside HEAD (repeatable)")
    ap.add_argument("--home", action="append", default=[], metavar="NAME=DIR",
                    help="an earlier checkout already on disk (where there is no git history, "
                    "e.g. `git archive COMMIT src loadtests | tar -x -C DIR`)")
    ap.add_argument("--no-tree", action="store_true",
                    help="leave the working tree out: only the --commit and --home columns (a "
                    "tree shared with unfinished edits is measured as a copy with --home)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--hold", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--mock-processes", type=int, default=1)
    ap.add_argument("--metrics-body", default=None,
                    help="the mock's GET /metrics body (default: 404, no metrics)")
    ap.add_argument("--server-cores", default="0", help="taskset list for the mock ('' : none)")
    ap.add_argument("--client-cores", default="1", help="taskset list for each client")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="servelab-tail-"))
    # the working tree is "HEAD" unless another column is named so (``--commit HEAD``, or
    # ``--home HEAD=DIR`` with an archive of it): then it is "tree", beside it
    named = set(a.commit) | {spec.partition("=")[0] for spec in a.home}
    homes = {} if a.no_tree else {"tree" if "HEAD" in named else "HEAD": ROOT}
    for commit in a.commit:
        homes[commit] = worktree(commit, tmp)
    for spec in a.home:
        name, _, path = spec.partition("=")
        homes[name] = Path(path).resolve()
    names = ["ref"] + list(homes)
    mock, url = start_mock(tmp, a)
    load0 = os.getloadavg()[0]
    results = []
    try:
        order = list(homes.items())
        for i, c in enumerate(levels):
            results.append({"ref": run_reference(url, c, a, tmp)})
            # the checkouts take turns at going first: one measured right after the reference,
            # or always last, read up to a tenth dearer or cheaper in CPU than beside itself
            for name, home in order[i % len(order):] + order[:i % len(order)]:
                results[i][name] = run_servelab(url, c, a, tmp, home, f"{name}-{i}")
    finally:
        mock.stop()
        for commit in a.commit:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(homes[commit])], capture_output=True)
    print(f"mock: TTFT {a.ttft_ms:g} ms, ITL {a.itl_ms:g} ms, {a.tokens} tokens, "
          f"{a.mock_processes} process(es) on cores {a.server_cores or 'any'}; clients on "
          f"cores {a.client_cores or 'any'}; {a.warmup:g} s warm-up + {a.hold:g} s measured; "
          f"load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after\n")
    print("\n".join(table(levels, results, names)))
    (tmp / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nraw figures: {tmp / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
