"""The response of one streamed request: exactly one HTTP response per request, head parsed here,
body framing left to the stream reader.

geventhttpclient's C parser reads the head (status, headers, interim 1xx answers), but only the
head: this class feeds it the bytes up to each head's blank line and keeps what follows as
``rest``. A 200 stream's body is then de-chunked by ``client.framing`` together with its SSE
lines, in one pass per network read, without the parser's Python callback per HTTP chunk
(``client/stream.py`` says what that saves). Any other answer (an error status whose body is
read for its message) goes back through the parser: ``read`` feeds it ``rest`` first.

A connection carries exactly one response: bytes a server sends after a complete final response
(a body longer than its Content-Length, an unsolicited second response, stray bytes) are dropped
and the connection is closed instead of reused, whether they came in the same read or later
(the pool's keep-alive check sees those).
"""
from __future__ import annotations

import errno

import gevent.socket
from geventhttpclient.response import (HTTPConnectionClosed, HTTPParseError,
                                       HTTPSocketPoolResponse)

_END = b"\r\n\r\n"
# a head (status line and headers) longer than this is no LLM server's: refused, not buffered
MAX_HEAD = 1 << 20


class _Trailing(Exception):
    """Stops the parser at the first byte after a complete final response."""


class OneResponse(HTTPSocketPoolResponse):
    _final_done = False
    trailing = False   # bytes followed the complete response; the connection is not reused
    rest = b""         # body bytes read with the head and not given to the parser

    def _read_headers(self, pre_buffered: bytes = b"") -> None:
        sock = self._sock
        buf = pre_buffered
        fed = 0          # bytes of ``buf`` the parser has seen (a head not yet ended)
        start = not buf
        try:
            while True:
                # the parser gets each head up to its blank line, never a byte of the body
                end = buf.find(_END, max(0, fed - 3))
                if end >= 0:
                    self.feed(buf[fed:end + 4])
                    buf, fed = buf[end + 4:], 0
                    if self.headers_complete and self.get_code() >= 200:
                        break
                    continue   # an interim 1xx answer: the final head follows
                if buf:
                    if len(buf) > MAX_HEAD:
                        raise HTTPParseError(f"response head over {MAX_HEAD >> 20} MiB")
                    self.feed(buf[fed:])
                    fed = len(buf)
                try:
                    data = sock.recv(self.block_size)
                except gevent.socket.error as e:
                    if e.errno == errno.ECONNRESET and start:
                        raise HTTPConnectionClosed("connection closed.") from None
                    raise
                if not data:
                    if start:
                        raise HTTPConnectionClosed("connection closed.")
                    if self.headers_complete:
                        raise HTTPParseError("connection closed after interim response")
                    raise HTTPParseError("connection closed before end of the headers")
                start = False
                buf += data
            self.rest = buf
            if self.message_complete:   # a bodyless final answer (204, 304)
                self.done(bool(buf))
        except BaseException:
            self.release()
            raise

    def read(self, length: int | None = None) -> bytes:
        """The body through the parser (error answers): the bytes read with the head first."""
        if self.rest:
            rest, self.rest = self.rest, b""
            self.feed(rest)
        return super().read(length)

    def done(self, trailing: bool) -> None:
        """The body is complete (``client.framing`` says so): the connection goes back to the
        pool, or is closed when bytes followed the response or the server asked to close."""
        self.message_complete = True
        if trailing:
            self._trailing_data_dropped = True
            self.trailing = True
        self.release()

    def _on_message_begin(self) -> None:
        if self._final_done:
            raise _Trailing()
        super()._on_message_begin()

    def _on_message_complete(self) -> None:
        # mark only: ``feed`` releases once the parser is done with this read
        self.message_complete = True
        if self.headers_complete and self.get_code() >= 200:
            self._final_done = True

    def feed(self, data) -> None:
        try:
            super().feed(data)
        except (_Trailing, HTTPParseError):
            if not self._final_done:
                raise
            self.message_complete = True
            self._trailing_data_dropped = True
            self.trailing = True
        if self.message_complete and self._final_done and self._sock is not None:
            self.release()
