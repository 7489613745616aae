#!/usr/bin/env python
"""The raw-socket reference client: what a streamed chat request costs with nothing in between.

One process, non-blocking sockets on ``selectors`` (epoll), no HTTP library. It does the
measuring work servelab does, in the plainest Python, and nothing else: it undoes the chunked
framing (so it knows where a body ends), splits SSE lines, stamps each content chunk with its
read's time and takes its token count from the continuous usage (``bytes.find`` and ``int``, as
servelab's fast path), decodes the other events (role, usage) with ``json.loads``, and keeps
every request's stamps and counts in memory. It stores, ships and checks nothing, runs no
Locust and no web UI: what it costs is the floor of a client that measures. It keeps
closed-loop streams (each restarted as soon as its body ends), started in the groups Locust
starts servelab's users in (``spawn_groups``: at most 100 a second, earlier levels' users
staying), each request ``--tokens`` output tokens (``N``, or ``LO-HI``: uniform, from a seeded
generator) and named by its ``X-Request-Id`` (``ref-1``, ``ref-2``, ...), so its figures are the
floor servelab's are held against in the same run (``bench/tail.py``, ``bench/loadgen.py``).
Measured over the window from ``--warmup`` after the last group to ``--hold`` later, for
requests sent in it:

- TTFT: send to the first read holding a content chunk, per request id (so a caller can take
  off the server's own TTFT from its records: the TTFT the client added);
- ITL gap: between consecutive reads holding content chunks of one stream (further chunks in
  the same read are gaps of 0, as servelab stamps every chunk of a read with the read's time);
- CPU: this process's user + system time over the window, per content chunk read in it.

Prints one JSON object: ``ttft_ms`` (request id -> ms), ``itl_ms`` (a list), ``chunks``,
``cpu_s``, ``us_per_chunk``, ``requests``. Run: ``python bench/reference_client.py --url URL
(--streams N | --groups N,N,...) --warmup S --hold S --tokens N|LO-HI``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import resource
import selectors
import socket
import time

CONTENT = b'"content":"'
COMPLETION = b'"completion_tokens":'


def request_maker(tokens: str, seed: int = 1):
    """request(rid) -> the bytes of one streamed chat request named ``rid``; its output tokens
    ``N``, or ``LO-HI`` (uniform, drawn from a generator seeded with ``seed``)."""
    lo, _, hi = tokens.partition("-")
    lo, hi = int(lo), int(hi or lo)
    rng = random.Random(seed)
    bodies: dict[int, bytes] = {}

    def request(rid: str) -> bytes:
        n = rng.randint(lo, hi)
        if n not in bodies:
            bodies[n] = json.dumps({
                "model": "calibration", "max_tokens": n, "stream": True,
                "messages": [{"role": "user", "content": "bench"}],
                "stream_options": {"include_usage": True,
                                   "continuous_usage_stats": True}}).encode()
        b = bodies[n]
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\nX-Request-Id: %s\r\n\r\n%s"
                % (len(b), rid.encode(), b))

    return request


def spawn_groups(levels: list[int], index: int) -> list[int]:
    """The groups of users started together by the time level ``index`` runs: servelab's shape
    asks Locust for min(users, 100) users a second (shapes.py) and Locust's dispatcher hands
    them out in whole-second batches; the users of earlier levels stay."""
    groups, have = [], 0
    for level in levels[:index + 1]:
        step = max(1, min(level, 100))
        while have < level:
            groups.append(min(step, level - have))
            have += groups[-1]
    return groups


class Stream:
    __slots__ = ("sock", "rid", "sent", "first", "last", "measured", "buf", "body", "need",
                 "headers", "stamps", "tokens", "prev", "usage", "done")

    def __init__(self, sock):
        self.sock = sock
        self.rid = ""
        self.sent = self.first = self.last = 0.0
        self.measured = False
        self.reset()

    def reset(self) -> None:
        self.buf = b""          # bytes not yet framed
        self.body = b""         # de-chunked body bytes not yet split into lines
        self.need = -1          # bytes left of the current HTTP chunk (-1: at a size line)
        self.headers = True
        self.stamps: list[float] = []
        self.tokens: list[int] = []
        self.prev = 0
        self.usage = None
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Undo the chunked framing of ``data``; True once the body's last chunk came."""
        buf = self.buf + data
        if self.headers:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return False
            buf, self.headers = buf[end + 4:], False
        out = []
        while buf:
            if self.need < 0:
                eol = buf.find(b"\r\n")
                if eol < 0:
                    break
                size = int(buf[:eol].split(b";")[0], 16)
                if size == 0:
                    self.body += b"".join(out)
                    self.buf = b""
                    return True
                self.need, buf = size, buf[eol + 2:]
            take = buf[:self.need]
            out.append(take)
            self.need -= len(take)
            buf = buf[len(take):]
            if self.need == 0:
                if len(buf) < 2:
                    self.need = 0
                    break
                buf, self.need = buf[2:], -1
        self.buf = buf
        self.body += b"".join(out)
        return False

    def lines(self, t: float) -> int:
        """Handle the complete SSE lines of the body; the content chunks among them."""
        *lines, self.body = self.body.split(b"\n")
        n = 0
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            i = line.find(CONTENT)
            if i >= 0 and line[i + 11] != 34:   # 34 is '"': an empty string is no output
                self.stamps.append(t)
                k = line.rfind(COMPLETION, i)
                if k >= 0:
                    k += 20
                    end = line.find(b"}", k)
                    c = int(line[k:end])
                    self.tokens.append(c - self.prev)
                    self.prev = c
                n += 1
            elif line[5:].strip() == b"[DONE]":
                self.done = True
            else:
                obj = json.loads(line[5:])
                if not obj.get("choices") and obj.get("usage"):
                    self.usage = obj["usage"]
        return n


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(url: str, groups: list[int], warmup_s: float, hold_s: float, tokens: str,
        seed: int = 1) -> dict:
    """``sum(groups)`` streams, a group started each second, measured from ``warmup_s`` after
    the last group for ``hold_s``; ``tokens`` as ``request_maker``'s."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    sel = selectors.DefaultSelector()
    now = time.time
    t0 = now()
    start = t0 + len(groups) - 1 + warmup_s
    stop = start + hold_s
    ttft, itl, chunks, requests, kept = {}, [], 0, 0, []
    cpu_start = cpu_window = None
    send, spawn = _senders(host, int(port), request_maker(tokens, seed), sel, start, stop)
    pending, live, next_group = list(groups), sum(groups), t0
    while live:
        t = now()
        if pending and t >= next_group:
            spawn(pending.pop(0))
            next_group += 1.0
        if cpu_start is None and t >= start:
            cpu_start, chunks = cpu_s(), 0
        if cpu_window is None and t >= stop and cpu_start is not None:
            cpu_window = cpu_s() - cpu_start
        for key, _ in sel.select(timeout=0.05):
            st = key.data
            data = st.sock.recv(65536)
            t = now()
            ended = st.feed(data) if data else True
            n = st.lines(t)
            if n:
                if start <= t < stop:
                    chunks += n
                if st.measured:
                    if st.first:
                        itl.append(1000.0 * (t - st.last))
                    else:
                        st.first = t
                        ttft[st.rid] = 1000.0 * (t - st.sent)
                    itl.extend([0.0] * (n - 1))
                elif not st.first:
                    st.first = t
                st.last = t
            if ended:
                requests += st.measured
                kept.append((st.sent, st.stamps, st.tokens, st.usage))   # the request's row
                if t < stop and data:
                    send(st, t)
                else:   # past the window: this stream ends once its last request is in
                    sel.unregister(st.sock)
                    st.sock.close()
                    live -= 1
    if cpu_window is None:
        cpu_window = cpu_s() - (cpu_start or 0.0)
    return {"ttft_ms": ttft, "itl_ms": itl, "chunks": chunks, "cpu_s": cpu_window,
            "us_per_chunk": 1e6 * cpu_window / max(chunks, 1), "requests": requests}


def _senders(host: str, port: int, request, sel, start: float, stop: float):
    """send(stream, t): the next request on a stream, numbered (measured when sent inside the
    window); spawn(n): n new streams, each sending its first request at once."""
    now = time.time
    count = itertools.count(1)

    def send(st: Stream, t: float) -> None:
        st.sent, st.first = t, 0.0
        st.reset()
        st.measured = start <= t < stop
        st.rid = f"ref-{next(count)}"
        st.sock.send(request(st.rid))

    def spawn(n: int) -> None:
        for _ in range(n):
            s = socket.create_connection((host, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            st = Stream(s)
            sel.register(s, selectors.EVENT_READ, st)
            send(st, now())

    return send, spawn


def main(argv=None, client=run) -> int:
    """The client's command line; ``client`` is ``run`` or one with its signature (the gevent
    floor of ``bench/loadgen.py``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    streams = ap.add_mutually_exclusive_group(required=True)
    streams.add_argument("--streams", type=int, help="streams, started in Locust's groups")
    streams.add_argument("--groups", help="the streams started each second, e.g. 100,100,56")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--hold", type=float, default=20.0)
    ap.add_argument("--tokens", default="128", help="output tokens per request: N or LO-HI")
    ap.add_argument("--seed", type=int, default=1, help="seed of the LO-HI draws")
    a = ap.parse_args(argv)
    groups = ([int(x) for x in a.groups.split(",")] if a.groups
              else spawn_groups([a.streams], 0))
    print(json.dumps(client(a.url, groups, a.warmup, a.hold, a.tokens, a.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
