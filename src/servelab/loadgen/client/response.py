"""The response of one streamed request: exactly one HTTP response per request.

geventhttpclient's parser hands a connection back to the pool the moment a message completes,
in the middle of a read, and takes any bytes after it for the start of the next message on the
same parser (the way an interim 1xx is followed by the final answer). Bytes a server sends after
a complete final response (a body longer than its Content-Length, an unsolicited second
response, stray bytes on a keep-alive connection) would then be read as this stream's body or as
the next request's answer. Here the message's end only marks it complete; whatever follows a
final response is dropped and the connection is closed instead of reused, whether the extra
bytes came in the same read or later (the pool's keep-alive check sees those).
"""
from __future__ import annotations

from geventhttpclient.response import HTTPParseError, HTTPSocketPoolResponse


class _Trailing(Exception):
    """Stops the parser at the first byte after a complete final response."""


class OneResponse(HTTPSocketPoolResponse):
    _final_done = False
    trailing = False   # bytes followed the complete response; the connection is not reused

    def _read_headers(self, pre_buffered: bytes = b"") -> None:
        try:
            super()._read_headers(pre_buffered)
        except Exception as exc:
            # A failure after a complete final head (a bad chunk size in the same read) is the
            # stream's, whatever the read timing: the caller classifies it as one.
            if self.headers_complete and self.get_code() >= 200:
                try:
                    exc.servelab_status = self.get_code()
                except AttributeError:
                    pass
            raise

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
