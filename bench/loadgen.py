#!/usr/bin/env python
"""What the load generator itself costs, measured beside a minimal raw-socket client.

Both clients stream from the calibration server (``servelab.loadgen.calibration_server``): every
stream's first content chunk comes ``--ttft-ms`` after the request, then one chunk every
``--itl-ms``, whatever the load, so any extra spread is the client's (or the server's, which is
why the reference runs against the same server at the same concurrency).

- reference: one process, non-blocking sockets on ``selectors`` (epoll), no HTTP library, no
  JSON: it stamps each read and counts content chunks with ``bytes.count``.
- servelab: the real thing, ``locust -f loadtests/locustfile.py`` with a master and ONE worker
  process, every request recorded (spool, shipping, DuckDB), health sampled. Its figures come
  from its own database: TTFT percentiles of each concurrency level's measured window, chunks
  that arrived in the window, and the worker's CPU from its ``client_health`` samples.

Per concurrency level the table shows TTFT p50/p99 of both, CPU microseconds per streamed chunk
of both, and the worker's loop lag; the headline is the highest level whose servelab TTFT p99 is
within 5 ms of the reference's.

Usage: python bench/loadgen.py [--levels 32,64,128,256,384] [--hold 5] [--itl-ms 20]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTENT = b'"content":" tok'


# ---- the reference client ---------------------------------------------------------------------
def reference(url: str, concurrency: int, warmup_s: float, hold_s: float, tokens: int) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"model": "calibration", "max_tokens": tokens, "stream": True,
                       "messages": [{"role": "user", "content": "bench"}],
                       "stream_options": {"include_usage": True,
                                          "continuous_usage_stats": True}}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\nX-Request-Id: " % len(body))
    sel = selectors.DefaultSelector()
    wall = time.time
    t0 = wall()
    start, stop = t0 + warmup_s, t0 + warmup_s + hold_s
    firsts, chunks, count = {}, 0, [0]
    streams = {}

    def send(s, st):
        count[0] += 1
        rid = f"ref-{count[0]}"
        st[:] = [wall(), rid, False, b""]
        s.send(head + rid.encode() + b"\r\n\r\n" + body)

    for _ in range(concurrency):
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        streams[s] = []
        sel.register(s, selectors.EVENT_READ)
        send(s, streams[s])
    cpu0 = None
    while True:
        t = wall()
        if cpu0 is None and t >= start:
            r = resource.getrusage(resource.RUSAGE_SELF)
            cpu0, chunks = r.ru_utime + r.ru_stime, 0
        if t >= stop:
            break
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            data = s.recv(65536)
            t = wall()
            st = streams[s]
            n = data.count(CONTENT)
            if n and not st[2]:
                st[2] = True
                if st[0] >= start:
                    firsts[st[1]] = (st[0], t)     # sent, first content chunk (Unix s)
            chunks += n
            tail = st[3] + data[-7:]
            if tail.endswith(b"0\r\n\r\n"):
                send(s, st)
            else:
                st[3] = tail[-7:]
    r = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r.ru_utime + r.ru_stime - cpu0
    return {"chunks": chunks, "cpu_s": cpu, "us_per_chunk": 1e6 * cpu / max(chunks, 1),
            "firsts": firsts}


def _q(values, q):
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else None


# ---- helpers ----------------------------------------------------------------------------------
def start_server(tmp: Path, args) -> tuple[subprocess.Popen, str]:
    ready = tmp / "calib.ready"
    proc = subprocess.Popen([sys.executable, "-m", "servelab.loadgen.calibration_server",
                             "--port", "0", "--ready-file", str(ready), "--ttft-ms",
                             str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--record"],
                            start_new_session=True)
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None:
            raise SystemExit("the calibration server did not start")
        time.sleep(0.05)
    return proc, ready.read_text().strip()


def run_servelab(tmp: Path, url: str, levels: list[int], args) -> Path:
    profile = tmp / "bench.yaml"
    profile.write_text(
        "name: loadgen_bench\ndescription: the load generator's own cost\nendpoint: chat\n"
        "model: auto\nsalt: false\nclasses:\n  - name: chat\n    prompt_tokens: 32\n"
        f"    output_tokens: {args.tokens}\nload:\n  concurrency: {{levels: "
        f"[{', '.join(map(str, levels))}], warmup: {args.warmup}s, hold: {args.hold}s}}\n")
    db = tmp / "bench.duckdb"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    master = subprocess.Popen(base + [
        "--headless", "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
        str(port), "--expect-workers", "1", "--host", url, "--profile", str(profile), "--db",
        str(db), "--spool-dir", str(tmp / "spool"), "--exit-code-on-error", "0",
        "--only-summary"], stdout=open(tmp / "master.log", "wb"), stderr=subprocess.STDOUT,
        env=env, start_new_session=True)
    worker = subprocess.Popen(base + ["--worker", "--master-host", "127.0.0.1", "--master-port",
                                      str(port)], stdout=open(tmp / "worker.log", "wb"),
                              stderr=subprocess.STDOUT, env=env, start_new_session=True)
    master.wait()
    worker.wait(timeout=30)
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
        flags = con.execute("SELECT flags FROM runs").fetchone()[0]
        out["flags"] = flags
        return out
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="32,64,128,256,384")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=100, help="output tokens per request")
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference:
        print(json.dumps(reference(args.reference, args.concurrency, args.warmup, args.hold,
                                   args.tokens)))
        return 0
    levels = [int(x) for x in args.levels.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="servelab-bench-"))
    server, url = start_server(tmp, args)
    try:
        ref = {}
        for c in levels:
            server_records(url)  # start clean
            res = subprocess.run([sys.executable, __file__, "--reference", url, "--concurrency",
                                  str(c), "--warmup", str(args.warmup), "--hold",
                                  str(args.hold), "--tokens", str(args.tokens)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(res.stdout)
            records = server_records(url)
            ttfts = sorted(1000 * (first - sent) for sent, first in r["firsts"].values())
            added = added_ttft([(rid, 1000 * (f - s)) for rid, (s, f) in r["firsts"].items()],
                               records)
            r.update(ttft_p50=_q(ttfts, 0.5), ttft_p99=_q(ttfts, 0.99),
                     added_p50=_q(added, 0.5), added_p99=_q(added, 0.99))
            ref[c] = r
        db = run_servelab(tmp, url, levels, args)
        ours = servelab_rows(db, server_records(url))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    print(f"\nload generator cost: calibration server TTFT {args.ttft_ms:g} ms, ITL "
          f"{args.itl_ms:g} ms, {args.tokens} output tokens; {os.cpu_count()} CPUs; "
          f"servelab = 1 Locust worker process, everything recorded\n")
    head = ("streams", "TTFT p50/p99 ms ref", "servelab", "client-added TTFT p50/p99 ms ref",
            "servelab", "CPU us/chunk ref", "servelab", "worker CPU %", "loop lag p99/max ms",
            "errors")
    print(" | ".join(head))
    print(" | ".join("-" * len(h) for h in head))
    best = best_added = None

    def f(v, d=1):
        return "-" if v is None else f"{v:.{d}f}"

    for c in levels:
        r, s = ref[c], ours.get(c, {})
        ok = (s.get("ttft_p99") is not None and r["ttft_p99"] is not None
              and s["ttft_p99"] - r["ttft_p99"] <= 5.0 and not s.get("errors"))
        ok_added = (s.get("added_p99") is not None and r["added_p99"] is not None
                    and s["added_p99"] - r["added_p99"] <= 5.0 and not s.get("errors"))
        if ok:
            best = c
        if ok_added:
            best_added = c
        print(" | ".join([
            str(c), f"{f(r['ttft_p50'])}/{f(r['ttft_p99'])}",
            f"{f(s.get('ttft_p50'))}/{f(s.get('ttft_p99'))}" + ("" if ok else " *"),
            f"{f(r['added_p50'])}/{f(r['added_p99'])}",
            f"{f(s.get('added_p50'))}/{f(s.get('added_p99'))}" + ("" if ok_added else " *"),
            f(r["us_per_chunk"]), f(s.get("us_per_chunk")), f(s.get("cpu"), 0),
            f"{f(s.get('lag_p99'))}/{f(s.get('lag_max'))}", str(s.get("errors", "-"))]))
    print(f"\nhighest concurrency with servelab TTFT p99 within 5 ms of the reference: "
          f"{best if best is not None else 'none'}; with its client-added TTFT p99 within 5 ms "
          f"of the reference's: {best_added if best_added is not None else 'none'} "
          "(* = not within)")
    print(f"servelab run flags: {', '.join(ours.get('flags') or []) or 'none'}; files in {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
