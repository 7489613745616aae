#!/usr/bin/env python
"""What the load generator itself costs, measured beside a minimal raw-socket client.

Both clients stream from the calibration server (``bench/calibration_server.py``): every
stream's first content chunk comes ``--ttft-ms`` after the request, then one chunk every
``--itl-ms``, whatever the load, so any extra spread is the client's (or the server's, which is
why the reference runs against the same server at the same concurrency).

- reference: ``bench/reference_client.py``, the raw-socket client ``bench/tail.py`` holds
  servelab to: one process, non-blocking sockets on ``selectors`` (epoll), no HTTP library, doing
  only the measuring work servelab does (framing, SSE lines, per-chunk stamps and token counts).
- servelab: the real thing, ``locust -f loadtests/locustfile.py`` with a master and ONE worker
  process, every request recorded (spool, shipping, DuckDB), health sampled. Its figures come
  from its own database: TTFT percentiles of each concurrency level's measured window, chunks
  that arrived in the window, and the worker's CPU from its ``client_health`` samples.
- gevent floor (``--floor``): the reference's client on gevent with a greenlet per stream, what
  gevent's own wake-ups cost per chunk with no parsing at all.

Both face the same workload: the reference starts its streams in the groups Locust starts
servelab's users in (``spawn_groups``: up to 100 at once, one group a second, earlier levels'
users staying), and draws the same output lengths. ``fixed`` gives every request ``--tokens`` tokens, so a group's
streams finish and restart together (the worst case for per-request cost); ``varied`` draws them
uniformly from half to 1.5 times that, so restarts spread out (and fewer chunks arrive together).

Per concurrency level the table shows TTFT p50/p99 of both, CPU microseconds per streamed chunk
of both, and the worker's loop lag; the headline is the highest level up to which servelab's
TTFT p99 stays within 5 ms of the reference's. The load average before and after each workload
is printed: the machine is shared, so compare the columns of one run, and repeat (``--repeat``)
to see the noise.

Usage: python bench/loadgen.py [--levels 32,64,128,256,384] [--hold 5] [--itl-ms 20]
       [--workloads fixed,varied] [--repeat N] [--floor]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from reference_client import cpu_s, request_maker, spawn_groups  # bench/, first on sys.path
from reference_client import main as client_main
from servelab.core import procs

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION_SERVER = Path(__file__).resolve().with_name("calibration_server.py")
REFERENCE_CLIENT = Path(__file__).resolve().with_name("reference_client.py")
GEVENT_FLOOR = "--gevent-floor"   # argv[1] of one level of the gevent floor, in its own process
CONTENT = b'"content":" tok'


# ---- the gevent floor --------------------------------------------------------------------------
def gevent_reference(url: str, groups: list[int], warmup_s: float, hold_s: float, tokens: str,
                     seed: int = 1) -> dict:
    """The reference's streams (``reference_client.run``'s arguments) on gevent with one
    greenlet per stream and its blocking ``recv``: what gevent's own wake-up costs per chunk,
    with no parsing and no recording (``--floor``)."""
    from gevent import monkey

    monkey.patch_all()
    import gevent

    host, port = url.split("//", 1)[1].rsplit(":", 1)
    request = request_maker(tokens, seed)
    wall = time.time
    t0 = wall()
    start = t0 + len(groups) - 1 + warmup_s
    stop = start + hold_s
    ttft, chunks, count = {}, [0], itertools.count(1)

    def user():
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while wall() < stop:
            rid = f"gev-{next(count)}"
            sent = wall()
            s.sendall(request(rid))
            first, tail = False, b""
            while True:
                data = s.recv(65536)
                t = wall()
                n = data.count(CONTENT)
                if n and not first:
                    first = True
                    if sent >= start:
                        ttft[rid] = 1000.0 * (t - sent)
                if start <= t < stop:
                    chunks[0] += n
                tail = (tail + data[-7:])[-7:]
                if tail.endswith(b"0\r\n\r\n") or not data:
                    break
        s.close()

    users = []
    for i, n in enumerate(groups):
        gevent.sleep(max(0.0, t0 + i - wall()))
        users += [gevent.spawn(user) for _ in range(n)]
    gevent.sleep(max(0.0, start - wall()))
    cpu0 = cpu_s()
    gevent.sleep(max(0.0, stop - wall()))
    cpu = cpu_s() - cpu0
    gevent.killall(users, timeout=2)
    return {"ttft_ms": ttft, "chunks": chunks[0], "cpu_s": cpu,
            "us_per_chunk": 1e6 * cpu / max(chunks[0], 1)}


def _q(values, q):
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else None


# ---- helpers ----------------------------------------------------------------------------------
def start_server(tmp: Path, args) -> tuple[procs.Child, str]:
    ready = tmp / "calib.ready"
    child = procs.spawn("the calibration server", [
        sys.executable, str(CALIBRATION_SERVER), "--port", "0", "--ready-file", str(ready),
        "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--record"],
        tmp / "calib.log", ready_file=ready)
    return child, child.wait_ready(60)


def run_servelab(tmp: Path, url: str, levels: list[int], tokens: str, args, name: str) -> Path:
    lo, _, hi = tokens.partition("-")
    lengths = f"{{kind: uniform, min: {lo}, max: {hi}}}" if hi else lo
    profile = tmp / f"{name}.yaml"
    profile.write_text(
        "name: loadgen_bench\ndescription: the load generator's own cost\nendpoint: chat\n"
        "model: auto\nsalt: false\nclasses:\n  - name: chat\n    prompt_tokens: 32\n"
        f"    output_tokens: {lengths}\nload:\n  concurrency: {{levels: "
        f"[{', '.join(map(str, levels))}], warmup: {args.warmup}s, hold: {args.hold}s}}\n")
    db = tmp / f"{name}.duckdb"
    port = procs.free_port()
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    master = procs.spawn("the Locust master", base + [
        "--headless", "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
        str(port), "--expect-workers", "1", "--host", url, "--profile", str(profile), "--db",
        str(db), "--spool-dir", str(tmp / "spool"), "--exit-code-on-error", "0",
        "--only-summary"], tmp / f"{name}-master.log", env=env)
    worker = procs.spawn("the Locust worker", base + [
        "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
        tmp / f"{name}-worker.log", env=env)
    try:
        master.wait()
        worker.wait(timeout=30)
    finally:
        worker.stop()
        master.stop()
    return db


def server_records(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/calib/requests", timeout=30) as resp:
        return json.loads(resp.read())


def added_ttft(pairs, records) -> list[float]:
    """Client TTFT minus the server's own (first chunk sent - request arrived), in ms: what the
    client added, whatever the server's own lag."""
    out = []
    for rid, client_ttft_ms in pairs:
        rec = records.get(rid)
        if rec and len(rec) >= 2:
            out.append(client_ttft_ms - 1000.0 * (rec[1] - rec[0]))
    return sorted(out)


def servelab_rows(db: Path, records: dict) -> dict[int, dict]:
    import duckdb

    from servelab.store.runs import saturation

    con = duckdb.connect(str(db), read_only=True)
    try:
        stages = con.execute("SELECT stage, level, measure_start_unix, measure_end_unix "
                             "FROM stages ORDER BY stage").fetchall()
        out = {}
        for stage, level, t0, t1 in stages:
            ttft = con.execute(
                "SELECT quantile_cont(ttft_ms, [0.5, 0.99]), count(*) FROM requests WHERE "
                "stage = ? AND NOT warmup AND error_kind IS NULL", [stage]).fetchone()
            added = added_ttft(con.execute(
                "SELECT request_id, ttft_ms FROM requests WHERE stage = ? AND NOT warmup AND "
                "error_kind IS NULL", [stage]).fetchall(), records)
            chunks = con.execute(
                "SELECT count(*) FROM (SELECT unnest(chunk_offsets_ms) AS o, sent_unix "
                "FROM requests) WHERE sent_unix + o / 1000 >= ? AND sent_unix + o / 1000 < ?",
                [t0, t1]).fetchone()[0]
            health = con.execute(
                "SELECT sum(cpu_percent) / 100, quantile_cont(loop_lag_p99_ms, 0.5), "
                "max(loop_lag_ms), avg(cpu_percent) FROM client_health WHERE t_unix > ? + 1 "
                "AND t_unix <= ?", [t0, t1]).fetchone()
            seconds = con.execute("SELECT count(*) FROM client_health WHERE t_unix > ? + 1 "
                                  "AND t_unix <= ?", [t0, t1]).fetchone()[0]
            # CPU over the health samples' whole seconds, chunks over the same span
            span_chunks = chunks * seconds / max(t1 - t0, 1e-9)
            errors = con.execute("SELECT count(*) FROM requests WHERE stage = ? AND error_kind "
                                 "IS NOT NULL", [stage]).fetchone()[0]
            out[int(level)] = {
                "ttft_p50": ttft[0][0] if ttft[0] else None,
                "ttft_p99": ttft[0][1] if ttft[0] else None, "requests": ttft[1],
                "added_p50": _q(added, 0.5), "added_p99": _q(added, 0.99),
                "chunks": chunks, "us_per_chunk": 1e6 * (health[0] or 0) / max(span_chunks, 1),
                "lag_p99": health[1], "lag_max": health[2], "cpu": health[3], "errors": errors}
        run_id, flags = con.execute("SELECT run_id, flags FROM runs").fetchone()
        out["flags"] = flags
        level_of = {stage: int(level) for stage, level, _, _ in stages}
        for sat in saturation(con, run_id):
            out[level_of[sat.stage]]["saturated"] = True
        return out
    finally:
        con.close()


def run_client(kind: str, url: str, groups: list[int], tokens: str, args, tmp: Path) -> dict:
    """One level of a minimal client (``reference``: bench/reference_client.py, or ``gevent``:
    the floor) in its own process."""
    server_records(url)  # start clean
    out = tmp / f"client-{kind}.out"
    script = [str(REFERENCE_CLIENT)] if kind == "reference" else [__file__, GEVENT_FLOOR]
    child = procs.spawn(f"the {kind} client", [
        sys.executable, *script, "--url", url, "--groups", ",".join(map(str, groups)),
        "--warmup", str(args.warmup), "--hold", str(args.hold), "--tokens", tokens], out)
    code = child.wait()
    child.stop()
    if code != 0:
        raise SystemExit(f"the {kind} client failed (exit {code}):\n{procs.log_tail(out)}")
    r = json.loads(out.read_text().strip().splitlines()[-1])
    records = server_records(url)
    ttfts = sorted(r["ttft_ms"].values())
    added = added_ttft(r["ttft_ms"].items(), records)
    r.update(ttft_p50=_q(ttfts, 0.5), ttft_p99=_q(ttfts, 0.99), added_p50=_q(added, 0.5),
             added_p99=_q(added, 0.99))
    return r


def run_workload(tmp: Path, url: str, levels: list[int], tokens: str, args, name: str) -> dict:
    """The reference (and the gevent floor) at every level, then servelab through all levels
    in one Locust run."""
    load_before = os.getloadavg()[0]
    ref, floor = {}, {}
    for i, c in enumerate(levels):
        ref[c] = run_client("reference", url, spawn_groups(levels, i), tokens, args, tmp)
        if args.floor:
            floor[c] = run_client("gevent", url, spawn_groups(levels, i), tokens, args, tmp)
    server_records(url)
    db = run_servelab(tmp, url, levels, tokens, args, name)
    ours = servelab_rows(db, server_records(url))
    return {"ref": ref, "floor": floor, "ours": ours, "load": (load_before, os.getloadavg()[0])}


def print_workload(levels: list[int], tokens: str, res: dict, repeat: str) -> dict:
    ref, ours, floor = res["ref"], res["ours"], res["floor"]
    print(f"\n{tokens} output tokens per request{repeat}; load average (1 min) "
          f"{res['load'][0]:.2f} before, {res['load'][1]:.2f} after\n")
    head = ("streams", "TTFT p50/p99 ms ref", "servelab", "client-added TTFT p50/p99 ms ref",
            "servelab", "CPU us/chunk ref", "servelab", "worker CPU %", "loop lag p99/max ms",
            "errors")
    if floor:
        head += ("gevent floor: TTFT p99 ms", "CPU us/chunk")
    print(" | ".join(head))
    print(" | ".join("-" * len(h) for h in head))

    def f(v, d=1):
        return "-" if v is None else f"{v:.{d}f}"

    held = held_added = None
    ok_so_far = ok_added_so_far = True
    for c in levels:
        r, s = ref[c], ours.get(c, {})
        ok = (s.get("ttft_p99") is not None and r["ttft_p99"] is not None
              and s["ttft_p99"] - r["ttft_p99"] <= 5.0 and not s.get("errors"))
        ok_added = (s.get("added_p99") is not None and r["added_p99"] is not None
                    and s["added_p99"] - r["added_p99"] <= 5.0 and not s.get("errors"))
        ok_so_far = ok_so_far and ok
        ok_added_so_far = ok_added_so_far and ok_added
        if ok_so_far:
            held = c
        if ok_added_so_far:
            held_added = c
        cells = [
            str(c), f"{f(r['ttft_p50'])}/{f(r['ttft_p99'])}",
            f"{f(s.get('ttft_p50'))}/{f(s.get('ttft_p99'))}" + ("" if ok else " *"),
            f"{f(r['added_p50'])}/{f(r['added_p99'])}",
            f"{f(s.get('added_p50'))}/{f(s.get('added_p99'))}" + ("" if ok_added else " *"),
            f(r["us_per_chunk"]), f(s.get("us_per_chunk")), f(s.get("cpu"), 0),
            f"{f(s.get('lag_p99'))}/{f(s.get('lag_max'))}" + (" S" if s.get("saturated") else ""),
            str(s.get("errors", "-"))]
        if floor:
            cells += [f(floor[c]["ttft_p99"]), f(floor[c]["us_per_chunk"])]
        print(" | ".join(cells))
    print(f"\nhighest concurrency held (it and every level below with servelab's TTFT p99 "
          f"within 5 ms of the reference's): {held or 'none'}; by client-added TTFT: "
          f"{held_added or 'none'} (* = not within; S = stage flagged generator_saturated)")
    print(f"servelab run flags: {', '.join(ours.get('flags') or []) or 'none'}")
    top = [c for c in levels if c >= 128]
    return {"held": held, "held_added": held_added, "load": res["load"],
            "ref_us": [ref[c]["us_per_chunk"] for c in top],
            "ours_us": [ours.get(c, {}).get("us_per_chunk") for c in top],
            "floor_us": [floor[c]["us_per_chunk"] for c in top if c in floor]}


def main() -> int:
    if sys.argv[1:2] == [GEVENT_FLOOR]:
        return client_main(sys.argv[2:], gevent_reference)
    args = _arguments()
    levels = [int(x) for x in args.levels.split(",")]
    workloads, chosen = _workloads(args)
    tmp = Path(tempfile.mkdtemp(prefix="servelab-bench-"))
    server, url = start_server(tmp, args)
    print(f"load generator cost: calibration server TTFT {args.ttft_ms:g} ms, ITL "
          f"{args.itl_ms:g} ms; {os.cpu_count()} CPUs; servelab = 1 Locust worker process "
          f"(and a master), everything recorded; reference = one raw-socket process; "
          f"streams start in the groups Locust starts users in")
    summary = []
    try:
        for rep in range(args.repeat):
            for w in chosen:
                res = run_workload(tmp, url, levels, workloads[w], args, f"{w}-{rep + 1}")
                tag = f", run {rep + 1} of {args.repeat}" if args.repeat > 1 else ""
                summary.append((w, rep + 1, print_workload(levels, workloads[w], res, tag)))
    finally:
        server.stop(10)
    _print_summary(summary, workloads, args.floor)
    print(f"files in {tmp}")
    return 0


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="32,64,128,256,384")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=100, help="output tokens per request (mean)")
    ap.add_argument("--workloads", default="fixed,varied",
                    help="fixed: every request --tokens long; varied: uniform from half to 1.5 "
                         "times --tokens")
    ap.add_argument("--repeat", type=int, default=1, help="run everything this many times")
    ap.add_argument("--floor", action="store_true",
                    help="also run the reference's client on gevent, a greenlet per stream "
                         "(what gevent's wake-ups cost per chunk, without any parsing)")
    return ap.parse_args()


def _workloads(args) -> tuple[dict[str, str], list[str]]:
    """Each workload's lengths (``N`` or ``LO-HI``), and the ones --workloads chose."""
    workloads = {"fixed": str(args.tokens),
                 "varied": f"{args.tokens // 2}-{args.tokens * 3 // 2}"}
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in workloads]
    if unknown:
        raise SystemExit(f"--workloads: found {', '.join(unknown)}; allowed fixed, varied")
    return workloads, chosen


def _print_summary(summary: list, workloads: dict[str, str], floor: bool) -> None:
    def rng(values):
        values = [v for v in values if v is not None]
        return f"{min(values):.1f}-{max(values):.1f}" if values else "-"

    print("\nsummary (CPU us/chunk at 128 streams and up)")
    print("workload | run | load avg before/after | CPU us/chunk ref | servelab | streams held "
          "(TTFT p99) | (client-added TTFT p99)" + (" | gevent floor us/chunk" if floor
                                                    else ""))
    print("-------- | --- | --------------------- | ---------------- | -------- | ------------ "
          "| ------------" + (" | ------" if floor else ""))
    for w, rep, s in summary:
        print(f"{w} ({workloads[w]}) | {rep} | {s['load'][0]:.2f}/{s['load'][1]:.2f} | "
              f"{rng(s['ref_us'])} | {rng(s['ours_us'])} | {s['held'] or 'none'} | "
              f"{s['held_added'] or 'none'}" + (f" | {rng(s['floor_us'])}" if floor
                                                else ""))


if __name__ == "__main__":
    raise SystemExit(main())
