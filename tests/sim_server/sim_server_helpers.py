"""A raw HTTP/1.1 + SSE client over asyncio sockets, for checking the simulator's bytes exactly."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

FAST = dict(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct",
            serve_args=["--max-model-len", "4096"])
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@dataclass
class SSEResult:
    status: int
    headers: dict
    events: list = field(default_factory=list)   # (receive time, data text) per SSE event
    body: bytes = b""                            # for non-streaming answers
    complete: bool = False                        # the chunked body ended properly

    @property
    def data(self) -> list[str]:
        return [d for _, d in self.events]

    def json_chunks(self) -> list[dict]:
        return [json.loads(d) for d in self.data if d != "[DONE]"]


async def _read_headers(reader) -> tuple[int, dict]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def sse_post(url: str, path: str, body, timeout: float = 20.0, raw: bytes | None = None,
                   headers: dict | None = None) -> SSEResult:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    payload = raw if raw is not None else json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    await writer.drain()
    try:
        return await asyncio.wait_for(_read_response(reader), timeout)
    finally:
        writer.close()


async def _read_response(reader) -> SSEResult:
    status, headers = await _read_headers(reader)
    res = SSEResult(status, headers)
    if headers.get("transfer-encoding") != "chunked":
        res.body = await reader.read()
        res.complete = True
        return res
    buf = b""
    while True:
        try:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                res.complete = True
                break
            data = await reader.readexactly(size + 2)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            break
        buf += data[:-2]
        now = time.time()
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            text = event.decode()
            assert text.startswith("data: "), text
            res.events.append((now, text[6:]))
    return res


def sse(url: str, path: str, body, **kw) -> SSEResult:
    return asyncio.run(sse_post(url, path, body, **kw))


async def get_json(url: str, path: str):
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
                 .encode())
    await writer.drain()
    status, headers = await _read_headers(reader)
    body = await reader.read()
    writer.close()
    if headers.get("transfer-encoding") == "chunked":
        raise AssertionError("unexpected chunked answer")
    return status, headers, body


def get(url: str, path: str) -> tuple[int, dict, bytes]:
    return asyncio.run(get_json(url, path))


def post_json(url: str, path: str, body) -> tuple[int, dict]:
    res = sse(url, path, body)
    return res.status, json.loads(res.body) if res.body else None
