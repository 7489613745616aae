"""Sending one request straight over the user's geventhttpclient connection pool.

``FastHttpSession.post`` costs about 150 us of CPU per request before the stream starts
(measured with yappi in a worker): a URL parse, a cookie-jar pass each way, two
case-insensitive header merges with a regex check of every header, the 100-continue and
chunked-body checks, and Locust's response wrappers. For a streamed LLM request all of that is
the same every time, so the request head is built once per (user, default headers) and each
request only adds its id and length. The socket still comes from the same ``ConnectionPool``
(keep-alive, connect timeout, the keep-alive check) and the response is still geventhttpclient's
``HTTPSocketPoolResponse`` (its C parser reads the headers and undoes chunked encoding), so
connection failures raise the same exceptions as before.

The session's cookie jar is honoured: a response that sets a cookie is handed to the jar, and
while the jar holds any, each request asks it for the ``Cookie`` header (through
geventhttpclient's urllib-compatible request and response adapters, which Locust's own
``FastRequest``/``FastResponse`` extend).
"""
from __future__ import annotations

import base64
import errno

import gevent.socket
from geventhttpclient.client import _FIELD_VALUE_RE, _TOKEN_RE
from geventhttpclient.response import HTTPParseError, HTTPSocketPoolResponse
from geventhttpclient.url import URL
from geventhttpclient.useragent import CompatRequest, CompatResponse

from servelab.core import credentials
from servelab.loadgen.client.response import OneResponse

_FIXED = {"Content-Type": "application/json", "Accept": "text/event-stream",
          "Accept-Encoding": "identity"}


class Wire:
    """One user's way to POST a JSON body to ``path`` and get the streamed response."""

    def __init__(self, session, base_url: str, path: str):
        self.session = session
        self.path = path
        self.agent = session.client                  # the session's UserAgent (headers, cookies)
        self.url = URL(f"{base_url.rstrip('/')}{path}")
        self.url_text = str(self.url)
        self.http = self.agent.clientpool.get_client(self.url)
        self.pool = self.http._connection_pool
        self._key = None
        self._head = b""

    def send(self, body: bytes, request_id: str) -> HTTPSocketPoolResponse:
        """Write the request and read the response headers; the body is left to the caller.

        Connection and protocol errors propagate as geventhttpclient raises them (a refused or
        timed-out connect from inside ``get_socket``); the socket goes back to the pool (or is
        closed) whatever happens."""
        head = self.head()
        if not _FIELD_VALUE_RE.fullmatch(request_id):
            raise ValueError(f"invalid request id {request_id!r}")
        jar = self.agent.cookiejar
        cookie = self._cookie() if jar is not None and getattr(jar, "_cookies", True) else None
        data = b"".join((head, b"X-Request-Id: ", request_id.encode("latin-1"),
                         cookie or b"", b"\r\nContent-Length: %d\r\n\r\n" % len(body), body))
        http, pool = self.http, self.pool
        sock = pool.get_socket()
        try:
            sock.sendall(data)
        except gevent.socket.error as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                pool.release_socket(sock)
                raise
            # The server may have answered (a 413, a 400) and closed before reading the whole
            # body: that answer is the finding, as in geventhttpclient's own client. The
            # response releases the socket itself, whatever happens.
            try:
                resp = OneResponse(sock, pool, block_size=http.block_size,
                                   method="POST", headers_type=http.headers_type)
            except (gevent.socket.error, HTTPParseError):
                raise exc from None
            return self._keep_cookies(resp)
        except BaseException:
            pool.release_socket(sock)
            raise
        resp = OneResponse(sock, pool, block_size=http.block_size, method="POST",
                           headers_type=http.headers_type)
        return self._keep_cookies(resp)

    def head(self) -> bytes:
        """Request line and headers up to X-Request-Id, rebuilt when the defaults change."""
        key = (tuple(dict.values(self.agent.default_headers)), self.session.auth_header,
               credentials.generation)
        if key != self._key:
            self._head = self._build_head()
            self._key = key
        return self._head

    def _build_head(self) -> bytes:
        http, url = self.http, self.url
        fields = http.headers_type()
        fields.update(http.default_headers)
        fields.update(self.agent.default_headers)
        if self.session.auth_header:
            fields["Authorization"] = self.session.auth_header
        fields.update(credentials.current().headers)   # --api-key, --header (core.credentials)
        fields.update(_FIXED)
        for name in ("X-Request-Id", "Content-Length", "Transfer-Encoding", "Expect", "Cookie"):
            if name in fields:
                del fields[name]
        if "host" not in fields:
            host = http.host
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
            fields["Host"] = host if http.port in (80, 443) else f"{host}:{http.port}"
        target = url.quoted_uri
        if http.use_proxy and not http.ssl:
            # a plain HTTP proxy takes the absolute URI and its own credentials
            target = http._base_url_string.rstrip("/") + target
            if http._proxy_credentials is not None and "proxy-authorization" not in fields:
                token = base64.b64encode(http._proxy_credentials.encode()).decode("ascii")
                fields["Proxy-Authorization"] = f"Basic {token}"
        lines = [f"POST {target} HTTP/1.1\r\n"]
        for name, value in fields.items():
            value = str(value)
            if not _TOKEN_RE.fullmatch(name) or not _FIELD_VALUE_RE.fullmatch(value):
                raise ValueError(f"invalid header {name!r}: {value!r}")
            lines.append(f"{name}: {value}\r\n")
        return "".join(lines).encode("latin-1")

    # ---- cookies (rare for LLM APIs: the slow path only runs when a server sets one) ----------
    def _request(self) -> CompatRequest:
        return CompatRequest(self.url, method="POST", headers=self.http.headers_type())

    def _cookie(self) -> bytes | None:
        req = self._request()
        self.agent.cookiejar.add_cookie_header(req)
        value = req.headers.get("Cookie")
        if not value or not _FIELD_VALUE_RE.fullmatch(value):
            return None
        return b"\r\nCookie: " + value.encode("latin-1")

    def _keep_cookies(self, resp: HTTPSocketPoolResponse) -> HTTPSocketPoolResponse:
        if self.agent.cookiejar is not None and "set-cookie" in resp._headers_index:
            req = self._request()
            self.agent.cookiejar.extract_cookies(CompatResponse(resp, request=req), req)
        return resp
