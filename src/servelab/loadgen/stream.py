"""Reading one OpenAI-style SSE stream: the load generator's hot path.

The body is read as it arrives: one ``recv`` per network read, fed to geventhttpclient's C HTTP
parser (which undoes chunked encoding), then every complete line in the buffer is handled and
stamped with the time of the read that completed it. This is ``readline(b"\\n")`` without its
per-line copies (an SSE event is two lines); ``iter_content`` must not be used: it waits for a
full 1 KiB block and adds tens of milliseconds at real ITLs.

A data line is classified with a few ``bytes.find`` calls: a content chunk, the role-only first
chunk, the usage chunk and ``[DONE]`` are told apart without decoding JSON. JSON is decoded only
for chunks that carry no output (role, usage, finish-only, errors, anything odd), at most a few
per request. Measured on a 230-byte vLLM chunk: the finds cost 1.5 us, ``orjson.loads`` plus the
dict walk 1.7 us; the finds also allocate nothing.
"""
from __future__ import annotations

import time

import gevent.socket
import orjson

_DATA = b"data:"
_DONE = b"[DONE]"
_CONTENT = b'"content":"'
_REASONING = (b'"reasoning_content":"', b'"reasoning":"')
_TEXT = b'"text":"'
_COMPLETION_TOKENS = b'"completion_tokens":'
_FINISH = b'"finish_reason":"'
_SSE_FIELDS = (b"event:", b"id:", b"retry:", b":")


class StreamClosed(ConnectionError):
    """The connection ended before the HTTP body was complete."""


class StreamState:
    """What one stream produced. Times are ``perf_counter`` seconds."""

    __slots__ = ("stamps", "tokens", "first_token", "done", "usage", "finish_reason",
                 "response_id", "error_kind", "error_text", "continuous")

    def __init__(self):
        self.stamps: list[float] = []    # one per content chunk
        self.tokens: list[int] = []      # per content chunk, from continuous usage (else empty)
        self.first_token: float | None = None
        self.done = False                # [DONE] seen
        self.usage: dict | None = None   # the final usage chunk's totals
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.error_kind: str | None = None
        self.error_text: str | None = None
        self.continuous = True           # every content chunk carried usage so far


def read_stream(raw, state: StreamState, chat: bool, texts: list | None = None) -> None:
    """Consume the SSE body of ``raw`` (a geventhttpclient response) into ``state``.

    ``texts``, when given, receives the text of every output chunk (a session's next turn resends
    the reply); only then are content chunks decoded.

    Socket and HTTP errors propagate (the caller classifies them); protocol problems inside the
    stream are recorded on ``state`` (the first one wins) and reading goes on, so the rest of the
    stream is still timed.
    """
    now = time.perf_counter
    buf = raw._body_buffer
    feed = raw.feed
    sock = raw._sock
    block = raw.block_size
    recv = _receiver(sock)
    stamps = state.stamps
    tokens = state.tokens
    marker = _CONTENT if chat else _TEXT
    mlen = len(marker)
    prev_completion = 0
    pending = b""
    t = now()
    while True:
        if buf:
            lines = (pending + buf).split(b"\n")
            del buf[:]
            pending = lines.pop()
            for line in lines:
                if line[:5] != _DATA:
                    if line and line != b"\r" and not line.startswith(_SSE_FIELDS):
                        _flag(state, "malformed_sse", "not an SSE line: " + _excerpt(line))
                    continue
                try:
                    i = line.find(marker)
                    if i >= 0:
                        if line[i + mlen] == 34:  # 34 is '"': an empty string is no output
                            i = -1
                    elif chat:
                        # reasoning tokens are output too: TTFT counts from the first of them
                        for r in _REASONING:
                            i = line.find(r)
                            if i >= 0:
                                i = i if line[i + len(r)] != 34 else -1
                                break
                    if i >= 0:
                        if line[-1] != 125 and line.rstrip()[-1:] != b"}":  # 125 is '}'
                            _flag(state, "malformed_json", "invalid JSON: " + _excerpt(line))
                            continue  # a frame cut short is no chunk
                        stamps.append(t)
                        if texts is not None:
                            texts.append(_chunk_text(line, chat))
                        k = line.find(_COMPLETION_TOKENS, i)
                        if k >= 0:
                            k += 20
                            end = k
                            while 47 < line[end] < 58:  # ASCII digits
                                end += 1
                            completion = int(line[k:end])
                            tokens.append(completion - prev_completion)
                            prev_completion = completion
                        else:
                            state.continuous = False
                        if line.find(_FINISH, i) >= 0:
                            state.finish_reason = _finish_reason(line)
                        if state.first_token is None:
                            state.first_token = t
                            if state.response_id is None:
                                state.response_id = _response_id(line)
                        continue
                    if line[5:].strip() == _DONE:
                        state.done = True
                        continue
                    prev_completion = _other_chunk(state, line, prev_completion)
                except IndexError:  # a line that ends inside a field
                    _flag(state, "malformed_json", "invalid JSON: " + _excerpt(line))
        if raw.message_complete:
            if pending.strip():
                _flag(state, "malformed_sse", "body ended inside a line: " + _excerpt(pending))
            return
        if sock is None:
            raise StreamClosed("connection closed")
        data = recv(block)
        t = now()
        if not data:
            feed(data)  # lets the parser finish a body delimited by the connection's end
            if not raw.message_complete:
                raise StreamClosed("connection closed before the end of the body")
            continue
        feed(data)


def _receiver(sock):
    """``recv`` that waits for readability first. gevent's own ``recv`` tries the read at once,
    and between two chunks that read always fails (EAGAIN: a syscall and an exception) before
    it waits; waiting first saves 2-4 us per chunk (bench/loadgen.py side by side). Plain TCP
    sockets only: TLS needs its own recv."""
    if sock is None or type(sock) is not gevent.socket.socket:
        return getattr(sock, "recv", None)
    wait, event, raw_recv = sock._wait, sock._read_event, sock._sock.recv

    def recv(n: int) -> bytes:
        wait(event)
        return raw_recv(n)

    return recv


def _other_chunk(state: StreamState, line: bytes, prev_completion: int) -> int:
    """A data line without output: role, usage, finish-only, error, or something odd."""
    try:
        obj = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        _flag(state, "malformed_json", "invalid JSON: " + _excerpt(line))
        return prev_completion
    if not isinstance(obj, dict):
        _flag(state, "malformed_json", "a data line that is no JSON object: " + _excerpt(line))
        return prev_completion
    if state.response_id is None and isinstance(obj.get("id"), str):
        state.response_id = obj["id"]
    if "error" in obj or obj.get("object") == "error":
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        _flag(state, "error_event", str(msg)[:500])
        return prev_completion
    choices = obj.get("choices")
    if not isinstance(choices, list):
        _flag(state, "malformed_json", "a chunk without choices: " + _excerpt(line))
        return prev_completion
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if choices:
            # a role or finish-only chunk with continuous usage: keep the running count
            prev_completion = usage.get("completion_tokens", prev_completion)
        else:
            state.usage = usage
    for c in choices:
        fr = c.get("finish_reason") if isinstance(c, dict) else None
        if fr:
            state.finish_reason = fr
    return prev_completion


def _chunk_text(line: bytes, chat: bool) -> str:
    try:
        choice = orjson.loads(line[5:])["choices"][0]
        part = choice["delta"] if chat else choice
        return part.get("content") or part.get("text") or part.get("reasoning_content") or ""
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return ""


def _flag(state: StreamState, kind: str, text: str) -> None:
    if state.error_kind is None:
        state.error_kind = kind
        state.error_text = text


def _excerpt(line: bytes, n: int = 200) -> str:
    return bytes(line[:n]).decode("utf-8", "replace").rstrip("\r\n")


def _finish_reason(line: bytes) -> str | None:
    j = line.find(_FINISH) + len(_FINISH)
    return line[j:line.find(b'"', j)].decode()


def _response_id(line: bytes) -> str | None:
    j = line.find(b'"id":"')
    if j < 0:
        return None
    j += 6
    return line[j:line.find(b'"', j)].decode()
