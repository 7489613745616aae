"""One bounded HTTP exchange with an endpoint servelab reads (``/metrics``, ``/v1/models``,
``/tokenize``, ``/version``, ``/health``), and what its answer was, named.

Bounded twice: a total deadline, not a per-read timeout (a page that trickles a byte every
50 ms would pass any per-read timeout and hold its caller for as long as it likes), and a size
cap read as a stream (a 50 MB page costs the cap and the connection is dropped; it is never held
in memory). Whatever the server does, ``fetch`` returns an ``Answer`` whose ``outcome`` names it;
only a URL servelab cannot use raises. The readers turn content into outcomes with ``json_of``
and ``sniff``, so every endpoint says the same thing for the same answer (``OUTCOMES``).

``cooperative=True`` uses gevent's socket and ssl modules whatever the process patched: the
master's scraper runs in the event loop the users' requests run in (``--workers 0``), and it
also yields after every read, so a fast 8 MB answer does not hold the loop either.
"""
from __future__ import annotations

import http.client
import io
import json
import socket as std_socket
import ssl as std_ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_BYTES = 8 << 20       # 8 MiB: a vLLM page with many engines and LoRA adapters is ~2 MB
READ_SIZE = 64 << 10

# What an answer can be, for every endpoint (a reader adds its own content checks' names).
OUTCOMES = {
    "ok": "answered as expected",
    "unreachable": "could not be connected to",
    "connection_reset": "closed the connection before an HTTP head",
    "malformed_http": "answered bytes that are not HTTP",
    "timeout": "gave no complete answer within the deadline",
    "truncated": "cut its body short",
    "too_large": "answered a body over the size cap",
    "http_<status>": "answered an error status",
    "html_page": "answered an HTML page",
    "empty": "answered an empty body",
    "wrong_content_type": "answered a Content-Type servelab does not read there",
    "not_json": "answered a body that is not JSON",
    "wrong_shape": "answered JSON without the fields servelab reads",
    "no_model": "listed no model",
}


class _Deadline(Exception):
    pass


class _TooLarge(Exception):
    pass


@dataclass
class Answer:
    url: str
    outcome: str                  # a name of OUTCOMES ("http_500" for http_<status>)
    status: int | None = None     # None: no HTTP head came
    content_type: str = ""        # media type, lower case, no parameters ("" when none)
    body: bytes = b""
    detail: str = ""              # what was seen, for messages and endpoint_events.detail
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def seen(self) -> str:
        """What came back, in words: status, type and size (or why nothing did)."""
        if self.status is None:
            return self.detail
        kind = self.content_type or "no Content-Type"
        size = "" if self.outcome == "too_large" else f", {len(self.body)} bytes"
        return f"HTTP {self.status}, {kind}{size}" + (f": {self.detail}" if self.detail else "")


def describe(outcome: str) -> str:
    """An outcome's meaning for a message ("answered an HTML page")."""
    key = "http_<status>" if outcome.startswith("http_") else outcome
    return OUTCOMES.get(key, outcome.replace("_", " "))


def excerpt(body: bytes, n: int = 120) -> str:
    text = body[:n].decode("utf-8", "replace")
    return repr(" ".join(text.split())) + ("..." if len(body) > n else "")


def sniff(body: bytes) -> str | None:
    """"html" or "json" when the body plainly is one (neither can start Prometheus text)."""
    head = body[:256].lstrip().lower()
    if head.startswith(b"<"):
        return "html"
    if head.startswith((b"{", b"[")):
        return "json"
    return None


class _Raw(io.RawIOBase):
    """The socket as http.client reads it: every recv gets only the time left, bytes counted."""

    def __init__(self, sock, deadline: float, limit: int, pause):
        self.sock, self.deadline, self.limit, self.pause = sock, deadline, limit, pause
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Deadline()
        self.sock.settimeout(left)
        n = self.sock.recv_into(buf)
        self.total += n
        if self.total > self.limit:
            raise _TooLarge()
        if self.pause is not None:
            self.pause()
        return n


class _Wrapped:
    def __init__(self, raw: _Raw):
        self.raw = raw

    def makefile(self, mode: str, *args, **kwargs):
        return io.BufferedReader(self.raw, READ_SIZE)


def _modules(cooperative: bool):
    if cooperative:
        import gevent
        import gevent.socket
        import gevent.ssl

        return gevent.socket, gevent.ssl, lambda: gevent.sleep(0)
    return std_socket, std_ssl, None


def _request(parts, path: str, method: str, body: bytes | None, headers: dict) -> bytes:
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    fixed = {"Host": host, "User-Agent": "servelab", "Accept-Encoding": "identity",
             "Connection": "close"}
    if body is not None:
        fixed["Content-Length"] = str(len(body))
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in {**headers, **fixed}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def fetch(url: str, path: str, *, method: str = "GET", body: bytes | None = None,
          headers: dict | None = None, deadline_s: float = 10.0, max_bytes: int = MAX_BYTES,
          cooperative: bool = False) -> Answer:
    """``method url+path`` within ``deadline_s`` in all (connect, send, head, body), reading at
    most ``max_bytes`` of body. ``url``: a base URL without user:password (the credentials
    come in ``headers``)."""
    parts = urlsplit(url.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// base URL")
    full = url.rstrip("/") + path
    target = ((parts.path or "") + path) or "/"
    sockets, ssl, pause = _modules(cooperative)
    t0 = time.monotonic()
    deadline = t0 + deadline_s
    answer = Answer(full, "timeout", detail=f"no complete answer within {deadline_s:g} s")
    sock = None
    try:
        sock = _connect(sockets, ssl, parts, deadline, answer)
        if sock is not None:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(_request(parts, target, method, body, headers or {}))
            _read(sock, deadline, max_bytes, pause, method, answer)
    except (_Deadline, TimeoutError):
        answer.outcome = "timeout"
        answer.detail = (f"no complete answer within {deadline_s:g} s" +
                         (f" (HTTP {answer.status} head came)" if answer.status else ""))
    except OSError as exc:   # the send failed: the server dropped us before reading
        answer.outcome, answer.detail = "connection_reset", f"{type(exc).__name__}: {exc}"
    finally:
        if sock is not None:
            sock.close()
    answer.elapsed_s = time.monotonic() - t0
    return answer


def _connect(sockets, ssl, parts, deadline: float, answer: Answer):
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        sock = sockets.create_connection((parts.hostname, port),
                                         timeout=max(0.001, deadline - time.monotonic()))
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        return sock
    except TimeoutError:
        raise
    except (OSError, ValueError) as exc:   # refused, no route, DNS, TLS (SSLError is OSError)
        answer.outcome, answer.detail = "unreachable", f"{type(exc).__name__}: {exc}"
        return None


def _read(sock, deadline: float, max_bytes: int, pause, method: str, answer: Answer) -> None:
    raw = _Raw(sock, deadline, max_bytes + (64 << 10), pause)
    resp = http.client.HTTPResponse(_Wrapped(raw), method=method)
    try:
        resp.begin()
    except http.client.RemoteDisconnected as exc:
        answer.outcome, answer.detail = "connection_reset", f"closed before a head ({exc})"
        return
    except (http.client.HTTPException, _TooLarge) as exc:
        answer.outcome = "malformed_http"
        answer.detail = f"{type(exc).__name__}: {str(exc)[:120]}" if not isinstance(
            exc, _TooLarge) else "a head over 64 KiB"
        return
    except ConnectionError as exc:
        answer.outcome, answer.detail = "connection_reset", f"{type(exc).__name__}: {exc}"
        return
    answer.status = resp.status
    answer.content_type = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
    declared = resp.length
    if declared is not None and declared > max_bytes:
        answer.outcome = "too_large"
        answer.detail = f"Content-Length {declared} over the {max_bytes} byte cap"
        return
    _read_body(resp, raw, max_bytes, answer)


def _read_body(resp, raw: _Raw, max_bytes: int, answer: Answer) -> None:
    chunks, size = [], 0
    try:
        while True:
            part = resp.read(READ_SIZE)
            if not part:
                break
            size += len(part)
            if size > max_bytes:
                raise _TooLarge()
            chunks.append(part)
        left = resp.length   # a Content-Length body read short: http.client does not say so
        if left:
            raise http.client.IncompleteRead(b"", left)
    except _TooLarge:
        answer.outcome = "too_large"
        answer.detail = f"more than {max_bytes} bytes (read no further)"
        return
    except (http.client.IncompleteRead, ConnectionError) as exc:
        answer.body = b"".join(chunks)
        answer.outcome = "truncated"
        answer.detail = f"cut after {len(answer.body)} bytes of body ({type(exc).__name__})"
        return
    except http.client.HTTPException as exc:   # a broken chunk size line
        answer.outcome, answer.detail = "malformed_http", f"{type(exc).__name__} in the body"
        return
    answer.body = b"".join(chunks)
    if 200 <= answer.status < 300:
        answer.outcome = "ok"
        answer.detail = ""
    else:
        answer.outcome = f"http_{answer.status}"
        answer.detail = excerpt(answer.body)


def json_of(answer: Answer):
    """(the decoded JSON, "ok", "") of an answer that should be JSON, else (None, outcome,
    what was seen): the transport's outcome, html_page, empty, wrong_content_type, not_json."""
    if not answer.ok:
        return None, answer.outcome, answer.seen()
    body = answer.body
    if not body.strip():
        return None, "empty", answer.seen()
    if sniff(body) == "html":
        return None, "html_page", f"{answer.seen()}: {excerpt(body)}"
    ctype = answer.content_type
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        return None, "wrong_content_type", f"{answer.seen()}: {excerpt(body)}"
    try:
        return json.loads(body), "ok", ""
    except ValueError as exc:
        return None, "not_json", f"{answer.seen()}: {exc}: {excerpt(body)}"
