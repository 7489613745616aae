"""An OpenAI-style SSE server that misbehaves on purpose: the hostile-server test kit.

Each stream request is answered by one behaviour from ``BEHAVIOURS`` (hostile_streams.py): the
one named by the request's ``X-Hostile`` header, else the server's ``--behaviour``. Everything
is written byte by byte over raw asyncio sockets (hostile_wire.py), so the wire carries exactly
what a broken server, proxy or hand-written mock would send. ``EXPECTED`` is the ``error_kind``
servelab documents for each one (analysis/README.md, "How a request is classified"); ``None``
is a success.

``GET /hostile/seen`` answers the number of requests whose body the server read (the
invariant: every one of them is a stored row or counted in flight), ``/hostile/timings`` the
kit's own time from a request's body to its first content chunk (ms, per request id; what the
client's TTFT is judged against) and ``/hostile/endpoints`` the variants each endpoint served.
The endpoints servelab reads besides the stream (``/metrics``, ``/v1/models``, ``/tokenize``,
``/version``, ``/health``) answer hostile variants chosen per request by header
(hostile_endpoints.py). Run: ``python hostile_server.py --port 0 --ready-file F
[--behaviour NAME]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

from hostile_endpoints import ROUTES, Rotation, answer
from hostile_streams import BEHAVIOURS, EXPECTED  # noqa: F401  (EXPECTED: the tests' table)
from hostile_wire import Conn

# A base URL http://HOST:PORT/v/VARIANTS picks the endpoints' variants as their header would:
# for readers that take a base URL and send no header of the test's (a health check).
PREFIX = re.compile(r"^/v/([^/]+)(/.*)$")

class HostileServer:
    def __init__(self, default: str):
        self.default = default
        self.seen: dict[str, int] = {}
        self.timings: dict[str, float] = {}   # request id -> the kit's own TTFT, ms
        self.rotation = Rotation()

    async def handle(self, reader, writer):
        c = Conn(reader, writer)
        try:
            while not c.close:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = {k.strip().lower(): v.strip() for k, _, v in
                          (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(fields.get("content-length", "0")))
                t_read = time.perf_counter()
                path = lines[0].split(" ")[1].split("?")[0]
                prefixed = PREFIX.match(path)
                if prefixed and prefixed.group(2) in ROUTES:   # /v/VARIANTS/ENDPOINT
                    path = prefixed.group(2)
                    fields[ROUTES[path].header] = prefixed.group(1)
                if path.startswith("/hostile/"):
                    await self.own(c, path)
                elif path in ROUTES:
                    variant, n = self.rotation.pick(path, fields)
                    await answer(c, path, variant, _json(body), n)
                elif not path.startswith("/v1/"):
                    await c.fixed(b"not found", head=b"HTTP/1.1 404 Not Found\r\n")
                else:
                    await self.stream(c, fields, t_read)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    async def own(self, c, path: str):
        """The kit's own routes: what it saw (requests per behaviour, endpoint variants served,
        its own TTFT of each request)."""
        data = {"/hostile/seen": self.seen, "/hostile/endpoints": self.rotation.served,
                "/hostile/timings": self.timings}.get(path)
        if data is None:
            return await c.fixed(b"not found", head=b"HTTP/1.1 404 Not Found\r\n")
        await c.fixed(json.dumps(data).encode(),
                      head=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")

    async def stream(self, c, fields: dict, t_read: float):
        name = fields.get("x-hostile", self.default)
        self.seen[name] = self.seen.get(name, 0) + 1
        rid = fields.get("x-request-id", "none")
        c.sent_at = []
        await BEHAVIOURS[name][0](c, rid)
        if len(c.sent_at) >= 2:   # the role chunk, then the first content chunk
            self.timings[rid] = (c.sent_at[1] - t_read) * 1000.0


def _json(body: bytes) -> dict:
    try:
        obj = json.loads(body) if body else {}
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


async def serve(port: int, default: str, ready_file: str | None):
    hs = HostileServer(default)
    server = await asyncio.start_server(hs.handle, "127.0.0.1", port, limit=1 << 20)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    if ready_file:
        Path(ready_file).write_text(url + "\n")
    print(url, flush=True)
    async with server:
        await server.serve_forever()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--behaviour", default="ok", choices=sorted(BEHAVIOURS))
    ap.add_argument("--ready-file")
    a = ap.parse_args(argv)
    try:
        asyncio.run(serve(a.port, a.behaviour, a.ready_file))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
