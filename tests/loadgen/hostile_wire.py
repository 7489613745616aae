"""The hostile kit's wire: one connection of the kit's server, written byte by byte (a head, a
chunked or fixed-length body, a reset), so the wire carries exactly what a broken server, proxy
or hand-written mock would send. Shared by the stream behaviours (hostile_server.py) and the
other endpoints' answers (hostile_endpoints.py)."""
from __future__ import annotations

import asyncio
import socket
import struct
import time

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
GAP_S = 0.002       # between chunks


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


def head(status: str = "200 OK", content_type: str | None = "application/json") -> bytes:
    typed = f"Content-Type: {content_type}\r\n" if content_type else ""
    return f"HTTP/1.1 {status}\r\n{typed}".encode()


class Conn:
    def __init__(self, reader, writer):
        self.r, self.w = reader, writer
        self.close = False   # end the connection after this answer
        self.sent_at: list[float] = []   # perf_counter after each streamed part

    async def send(self, data: bytes):
        self.w.write(data)
        await self.w.drain()

    async def stream(self, parts: list[bytes], gap: float = GAP_S, head: bytes = HEAD,
                     last: bytes = b""):
        await self.send(head + b"Transfer-Encoding: chunked\r\n\r\n")
        for p in parts:
            await asyncio.sleep(gap)
            await self.send(chunked([p]))
            self.sent_at.append(time.perf_counter())
        await self.send(b"0\r\n\r\n" + last)   # ``last``: bytes after the body, same write

    async def fixed(self, body: bytes, head: bytes = HEAD, length: int | None = None):
        n = len(body) if length is None else length
        await self.send(head + b"Content-Length: %d\r\n\r\n" % n + body)

    def reset(self):
        sock = self.w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.w.transport.abort()
        self.close = True
