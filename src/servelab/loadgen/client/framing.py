"""HTTP/1.1 body framing of a streamed answer, undone in plain Python on each network read.

The stream reader hands every read to ``Framing.take`` and gets back the body bytes it held
(chunked encoding undone, a Content-Length counted, or everything up to the close), which go
straight to the SSE line handling: one pass per read, no callback per HTTP chunk, no buffer
copied between a parser and the reader. A read that holds whole chunks (the usual case: a
server writes one SSE event per chunk) costs one ``find``, one ``int`` and one slice per chunk.

What HTTP says is wrong (a chunk size that is no hex number, a chunk not followed by CRLF, a
size line or trailer over ``MAX_LINE``) raises ``HTTPParseError``, which the request classifies
as ``malformed_http``, as it did when geventhttpclient's parser read the body. Bytes after the
end of the body set ``trailing`` (the connection is then closed, not reused).
"""
from __future__ import annotations

from geventhttpclient.response import HTTPParseError

_CRLF = b"\r\n"
# a chunk-size line or trailer field is a few bytes; a server sending more is not speaking HTTP
MAX_LINE = 64 << 10
_SIZE, _DATA, _CRLF_AFTER, _TRAILER, _DONE = range(5)
_HEX = frozenset(b"0123456789abcdefABCDEF")


class Framing:
    """``take(data) -> body bytes``; ``complete`` once the body's end was read."""

    __slots__ = ("chunked", "left", "phase", "held", "complete", "trailing", "at_size")

    def __init__(self, chunked: bool, length: int | None):
        self.chunked = chunked
        self.left = length if length is not None else -1   # -1: the body ends at the close
        self.phase = _SIZE
        self.held = b""            # framing bytes of an unfinished size line, CRLF or trailer
        self.complete = (not chunked) and length == 0
        self.trailing = False
        # at a chunk-size line with nothing held: the stream reader's fast path may cut the
        # next read itself when it is exactly one whole chunk (which leaves this state as is)
        self.at_size = chunked

    @classmethod
    def of(cls, raw) -> "Framing":
        """The framing of a response whose head ``raw`` (``OneResponse``) has parsed; the parser
        already refused a head with both Transfer-Encoding and Content-Length."""
        te = raw.get("transfer-encoding")
        if te is not None and "chunked" in (te if isinstance(te, str) else ",".join(te)).lower():
            return cls(True, None)
        return cls(False, raw.content_length if raw.message_complete is False else 0)

    def closed(self) -> bool:
        """The connection ended: True when that ends the body (no length was given)."""
        if not self.chunked and self.left < 0:
            self.complete = True
        return self.complete

    def take(self, data) -> bytes:
        if self.complete:
            self.trailing = self.trailing or bool(data)
            return b""
        if not self.chunked:
            left = self.left
            if left < 0:
                return data
            if len(data) < left:
                self.left = left - len(data)
                return data
            self.left = 0
            self.complete = True
            self.trailing = len(data) > left
            return data[:left] if self.trailing else data
        if self.held:
            data = self.held + data
            self.held = b""
        n = len(data)
        phase = self.phase
        if phase == _DATA:
            left = self.left
            if n < left:   # a large chunk going on across reads
                self.left = left - n
                return data
            # the usual case: the rest of a chunk and more chunks after it
            out = [data[:left]]
            pos, phase = left, _CRLF_AFTER
        else:
            out = []
            pos = 0
        while pos < n:
            if phase == _SIZE:
                eol = data.find(_CRLF, pos)
                if eol < 0:
                    self._hold(data, pos)
                    break
                line = data[pos:eol]
                try:
                    # isalnum keeps int() from taking a sign, spaces or underscores
                    size = int(line, 16) if line.isalnum() else _size(line)
                except ValueError:
                    raise HTTPParseError(f"invalid chunk size {bytes(line[:40])!r}") from None
                pos = eol + 2
                if size:
                    end = pos + size
                    if end > n:
                        out.append(data[pos:])
                        self.left = end - n
                        self.phase = _DATA
                        self.at_size = False
                        return b"".join(out)
                    out.append(data[pos:end])
                    pos = end
                    phase = _CRLF_AFTER
                else:
                    phase = _TRAILER
            elif phase == _CRLF_AFTER:
                if n - pos < 2:
                    if data[pos:] not in (b"", b"\r"):
                        raise HTTPParseError("invalid chunk: no CRLF after its data")
                    self._hold(data, pos)
                    break
                if data[pos:pos + 2] != _CRLF:
                    raise HTTPParseError("invalid chunk: no CRLF after its data")
                pos += 2
                phase = _SIZE
            else:  # _TRAILER: header fields until a blank line
                eol = data.find(_CRLF, pos)
                if eol < 0:
                    self._hold(data, pos)
                    break
                if eol == pos:
                    pos += 2
                    self.complete = True
                    self.trailing = pos < n
                    phase = _DONE
                    break
                pos = eol + 2
        self.phase = phase
        self.at_size = phase == _SIZE and not self.held
        return out[0] if len(out) == 1 else b"".join(out)

    def _hold(self, data, pos: int) -> None:
        held = data[pos:]
        if len(held) > MAX_LINE:
            raise HTTPParseError(f"a chunk-size line or trailer over {MAX_LINE >> 10} KiB")
        self.held = held


def _size(line: bytes) -> int:
    """A chunk-size line: hex digits, then any extension after ';' (ignored)."""
    digits = line.split(b";", 1)[0].strip(b" \t") if b";" in line else line
    if not digits or not _HEX.issuperset(digits):
        raise HTTPParseError(f"invalid chunk size {bytes(line[:40])!r}")
    return int(digits, 16)
