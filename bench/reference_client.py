#!/usr/bin/env python
"""The raw-socket reference client: what a streamed chat request costs with nothing in between.

One process, non-blocking sockets on ``selectors`` (epoll), no HTTP library. It does the
measuring work servelab does, in the plainest Python, and nothing else: it undoes the chunked
framing (so it knows where a body ends), splits SSE lines, stamps each content chunk with its
read's time and takes its token count from the continuous usage (``bytes.find`` and ``int``, as
servelab's fast path), decodes the other events (role, usage) with ``json.loads``, and keeps
every request's stamps and counts in memory. It stores, ships and checks nothing, runs no
Locust and no web UI: what it costs is the floor of a client that measures. It keeps ``--streams``
closed-loop streams (each restarted as soon as its body ends), started in Locust's groups (at
most 100 a second), so its figures are the floor servelab's are held against in the same run
(``bench/tail.py``). Measured over the window from ``--warmup`` after the last group to
``--hold`` later, for requests sent in it:

- TTFT: send to the first read holding a content chunk;
- ITL gap: between consecutive reads holding content chunks of one stream (further chunks in
  the same read are gaps of 0, as servelab stamps every chunk of a read with the read's time);
- CPU: this process's user + system time over the window, per content chunk read in it.

Prints one JSON object: ``ttft_ms`` and ``itl_ms`` lists, ``chunks``, ``cpu_s``, ``requests``.
Run: ``python bench/reference_client.py --url URL --streams N --warmup S --hold S --tokens N``.
"""
from __future__ import annotations

import argparse
import json
import resource
import selectors
import socket
import time

CONTENT = b'"content":"'
COMPLETION = b'"completion_tokens":'


def request_bytes(tokens: int) -> bytes:
    body = json.dumps({"model": "calibration", "max_tokens": tokens, "stream": True,
                       "messages": [{"role": "user", "content": "bench"}],
                       "stream_options": {"include_usage": True,
                                          "continuous_usage_stats": True}}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


class Stream:
    __slots__ = ("sock", "sent", "first", "last", "measured", "buf", "body", "need", "headers",
                 "stamps", "tokens", "prev", "usage", "done")

    def __init__(self, sock):
        self.sock = sock
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


def run(url: str, streams: int, warmup_s: float, hold_s: float, tokens: int) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    payload = request_bytes(tokens)
    sel = selectors.DefaultSelector()
    now = time.time
    groups = [min(100, streams - i) for i in range(0, streams, 100)]
    t0 = now()
    start = t0 + len(groups) - 1 + warmup_s
    stop = start + hold_s
    ttft, itl, chunks, requests, kept = [], [], 0, 0, []
    cpu_start = cpu_window = None
    send, spawn = _senders(host, int(port), payload, sel, start, stop)
    live, next_group = streams, t0
    while live:
        t = now()
        if groups and t >= next_group:
            spawn(groups.pop(0))
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
                        ttft.append(1000.0 * (t - st.sent))
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
            "requests": requests}


def _senders(host: str, port: int, payload: bytes, sel, start: float, stop: float):
    """send(stream, t): the next request on a stream (measured when sent inside the window);
    spawn(n): n new streams, each sending its first request at once."""
    now = time.time

    def send(st: Stream, t: float) -> None:
        st.sent, st.first = t, 0.0
        st.reset()
        st.measured = start <= t < stop
        st.sock.send(payload)

    def spawn(n: int) -> None:
        for _ in range(n):
            s = socket.create_connection((host, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            st = Stream(s)
            sel.register(s, selectors.EVENT_READ, st)
            send(st, now())

    return send, spawn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--hold", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    print(json.dumps(run(a.url, a.streams, a.warmup, a.hold, a.tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
