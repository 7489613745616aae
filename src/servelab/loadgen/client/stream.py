"""Reading one OpenAI-style SSE stream: the load generator's hot path.

The body is read as it arrives, in blocks of up to 64 KiB: each network read is stamped once,
its HTTP framing undone by ``client.framing`` (the response head was parsed by
``client.response``, which leaves the body to this reader), and every SSE line it completed is
handled with that read's stamp: every event in one read gets that read's time, which is as
exact as the socket can tell. ``iter_content`` must not be used: it waits for a full 1 KiB block
and adds tens of milliseconds at real ITLs. Plain TCP streams are all read by one
``StreamReactor`` per process (an epoll in a gevent loop callback), so a chunk costs no greenlet
switch; TLS streams are read by their own greenlet.

A data line is classified with a few ``bytes.find`` calls: a content chunk, the role-only first
chunk, the usage chunk and ``[DONE]`` are told apart without decoding JSON. JSON is decoded only
for chunks that carry no output (role, usage, finish-only, errors, anything odd), at most a few
per request. The finds match vLLM's compact encoding; any other valid encoding of a content chunk
(a space after the colon, as Python's ``json.dumps`` writes it) misses them and is decoded in
full by ``chunks.other_chunk``, which stamps it with the same read time: slower, never lost.
Feeding geventhttpclient's parser instead (a Python callback per HTTP chunk, a buffer copied to
the line splitter) cost 10.7 us per 280-byte chunk against 6.6 us here, side by side on a
loaded 2-core machine; bench/tail.py on the H200 host: 15-18 us of CPU per chunk for the whole
run at 256-384 streams, against 18 us for the parser path in the same pass
(bench/results/h200_20261202_reader/).
"""
from __future__ import annotations

import os
import time
from array import array
from collections import deque

import gevent
import gevent.socket
from gevent import monkey
from gevent.hub import Waiter

from servelab.loadgen.client.chunks import (FINISH, chunk_count, chunk_text, excerpt, flag,
                                            finish_reason_of, other_chunk, response_id_of)
from servelab.loadgen.client.framing import Framing

_DATA = b"data:"
_DONE = b"[DONE]"
_CONTENT = b'"content":"'
_REASONING = (b'"reasoning_content":"', b'"reasoning":"')
_TEXT = b'"text":"'
_COMPLETION_TOKENS = b'"completion_tokens":'
_SSE_FIELDS = (b"event:", b"id:", b"retry:", b":")
_CRLF = b"\r\n"
_LF = b"\n"
_EVENT_END = b"\n\n\r\n"   # an event's blank line, then the end of its HTTP chunk
# no SSE line of an LLM stream comes near this; a server sending one would grow the buffer
MAX_LINE = 4 << 20
_epoll = monkey.get_original("select", "epoll")
_EPOLLIN = 1


class StreamClosed(ConnectionError):
    """The connection ended before the HTTP body was complete."""


class StreamState:
    """What one stream produced. Times are ``perf_counter`` seconds."""

    __slots__ = ("stamps", "tokens", "first_token", "done", "usage", "finish_reason",
                 "response_id", "error_kind", "error_text", "continuous", "quality")

    def __init__(self):
        # Arrays, not lists: the garbage collector does not walk their items. Every in-flight
        # stream's lists of floats were walked in each young-generation pass (gc.callbacks in a
        # worker at 384 streams: 3-4 ms per pass with lists, 2-3 ms with arrays).
        self.stamps = array("d")   # perf_counter of each content chunk
        self.tokens = array("q")   # per content chunk, from continuous usage (else empty)
        self.first_token: float | None = None
        self.done = False                # [DONE] seen
        self.usage: dict | None = None   # the final usage chunk's totals
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.error_kind: str | None = None
        self.error_text: str | None = None
        self.continuous = True           # every content chunk carried usage so far
        self.quality: list | None = None  # reasons a value the server sent was not stored


class StreamReader:
    """Turns the body of one response into a ``StreamState`` as it arrives.

    ``data(bytes, t)`` takes one network read, stamped ``t``: ``Framing`` undoes the HTTP
    framing, and every SSE line the read completed is handled. Socket and HTTP errors propagate
    (the caller classifies them); protocol problems inside the stream are recorded on the state
    (the first one wins) and reading goes on, so the rest of the stream is still timed.
    """

    __slots__ = ("raw", "state", "texts", "chat", "marker", "mlen", "prev_completion", "pending",
                 "framing")

    def __init__(self, raw, state: StreamState, chat: bool, texts: list | None = None):
        self.raw = raw
        self.state = state
        self.texts = texts
        self.chat = chat
        self.marker = _CONTENT if chat else _TEXT
        self.mlen = len(self.marker)
        self.prev_completion = 0
        self.pending = b""
        self.framing = Framing.of(raw)

    def data(self, data: bytes, t: float) -> bool:
        """One network read (``b""``: the connection ended); True once the body is complete."""
        framing = self.framing
        if data:
            if framing.at_size and not self.pending:
                # The usual read: whole HTTP chunks, each holding one SSE event, one data line
                # and its blank line. Each line is cut out of the read itself, without the
                # general framing's bookkeeping; from the first chunk that is anything else
                # (cut by the read, several lines, the last chunk), the rest of the read takes
                # the general path below, which finds the framing where these chunks left it.
                # A read of three events: 3.2-3.4 -> 2.2-2.9 us per chunk; ~19% of events at 256
                # streams came in such reads (bench/results/tail_20261203).
                pos, n = 0, len(data)
                while True:
                    eol = data.find(_CRLF, pos)
                    if not 0 < eol - pos < 9:
                        break
                    size = data[pos:eol]
                    try:
                        # the event's last byte is at end + 1 (no hex: the general path says so)
                        end = eol + int(size, 16) if size.isalnum() else -1
                    except ValueError:
                        break
                    if end <= eol + 2 or not data.startswith(_EVENT_END, end) \
                            or data.find(_LF, eol + 2, end) >= 0:
                        break
                    self.take_line(data[eol + 2:end], t)
                    pos = end + 4
                    if pos == n:
                        return False
                if pos:
                    data = data[pos:]
            body = framing.take(data)
            if body:
                self.take(body, t)
            if framing.complete:
                return self.finished()
            return False
        if framing.closed():   # a body delimited by the close
            return self.finished()
        raise StreamClosed("connection closed before the end of the body")

    def finished(self) -> bool:
        if not self.framing.complete:
            return False
        if self.pending.strip():
            flag(self.state, "malformed_sse", "body ended inside a line: "
                 + excerpt(self.pending))
            self.pending = b""
        if self.raw._sock is not None:
            self.raw.done(self.framing.trailing)
        return True

    def take(self, body: bytes, t: float) -> None:
        """Handle every line ``body`` completed, stamped ``t``."""
        lines = (self.pending + body).split(b"\n") if self.pending else body.split(b"\n")
        self.pending = lines.pop()
        if len(self.pending) > MAX_LINE:
            flag(self.state, "malformed_sse", f"a line over {MAX_LINE >> 20} MiB: "
                 + excerpt(self.pending, 80))
            self.pending = b""  # its rest is no SSE line either; memory stays bounded
        for line in lines:
            if line:   # not the blank line that ends each event
                self.take_line(line, t)

    def take_line(self, line: bytes, t: float) -> None:
        """One complete SSE line (without its LF), read at ``t``."""
        state = self.state
        if line[:5] != _DATA:
            if line != b"\r" and not line.startswith(_SSE_FIELDS):
                flag(state, "malformed_sse", "not an SSE line: " + excerpt(line))
            return
        try:
            i = line.find(self.marker)
            if i >= 0:
                if line[i + self.mlen] == 34:  # 34 is '"': an empty string is no output
                    i = -1
            elif self.chat:
                # reasoning tokens are output too: TTFT counts from the first of them
                for r in _REASONING:
                    i = line.find(r)
                    if i >= 0:
                        i = i if line[i + len(r)] != 34 else -1
                        break
            if i < 0:
                if line[5:].strip() == _DONE:
                    state.done = True
                else:
                    self.prev_completion = other_chunk(state, line, self.prev_completion, t,
                                                       self)
                return
            if line[-1] != 125 and line.rstrip()[-1:] != b"}":  # 125 is '}'
                flag(state, "malformed_json", "invalid JSON: " + excerpt(line))
                return  # a frame cut short is no chunk
            # a content chunk: stamp it, then its token count from continuous usage (the
            # usage object comes after the choices, so it is searched from the end)
            state.stamps.append(t)
            if self.texts is not None:
                self.texts.append(chunk_text(line, self.chat))
            k = line.rfind(_COMPLETION_TOKENS, i)
            if k >= 0:
                k += 20
                end = line.find(b"}", k)
                comma = line.find(b",", k, end)
                raw = line[k:end if comma < 0 else comma]
                try:
                    completion = int(raw)
                except ValueError:
                    completion = -1
                prev = self.prev_completion
                if prev <= completion <= 2147483647:  # COUNT_MAX, inline on the hot path
                    state.tokens.append(completion - prev)
                    self.prev_completion = completion
                else:
                    self.prev_completion = chunk_count(state, raw, prev)
            else:
                state.continuous = False
            if line.find(FINISH, i) >= 0:
                state.finish_reason = finish_reason_of(line)
            if state.first_token is None:
                state.first_token = t
                if state.response_id is None:
                    state.response_id = response_id_of(line)
        except (IndexError, ValueError):  # a line that ends inside a field
            flag(state, "malformed_json", "invalid JSON: " + excerpt(line))


def read_stream(raw, state: StreamState, chat: bool, texts: list | None = None) -> None:
    """Consume the SSE body of ``raw`` (a geventhttpclient response) into ``state``.

    ``texts``, when given, receives the text of every output chunk (a session's next turn resends
    the reply); only then are content chunks decoded.

    Plain TCP streams are read by the process's ``StreamReactor`` (one epoll for all streams, no
    greenlet switch per chunk); this greenlet sleeps until its stream ends. Other sockets (TLS)
    are read here, one ``recv`` per network read.
    """
    reader = StreamReader(raw, state, chat, texts)
    rest, raw.rest = raw.rest, b""
    if rest and reader.data(rest, time.perf_counter()):   # body bytes that came with the head
        return
    if reader.finished():
        return
    sock = raw._sock
    if sock is None:
        raise StreamClosed("connection closed")
    if type(sock) is gevent.socket.socket:
        reactor().wait(sock, reader)
        return
    now = time.perf_counter
    recv, block = sock.recv, raw.block_size
    while True:
        data = recv(block)
        if reader.data(data, now()):
            return
        if raw._sock is None:
            raise StreamClosed("connection closed")


class _Entry:
    __slots__ = ("recv", "data", "waiter", "error")

    def __init__(self, recv, data, waiter):
        self.recv = recv
        self.data = data    # the stream's ``StreamReader.data``
        self.waiter = waiter
        self.error = None


class StreamReactor:
    """Reads every plain-TCP stream of the process from one epoll, in a gevent loop callback.

    A greenlet that waits on its own socket costs a watcher start and stop, two greenlet
    switches and usually a failed read per chunk: measured 14 us per chunk for a bare gevent
    client against 8-9 us here (bench/loadgen.py's calibration server, 256 streams, side by
    side). The epoll descriptor is itself watched by gevent's loop; each time it is readable the
    callback reads every ready socket once (level-triggered: more data is found next round),
    stamps each read and hands it to the stream's ``StreamReader``. Only a stream that ended (or
    failed) wakes its greenlet, after the round, so every chunk of the round is stamped first.

    A greenlet interrupted while it waits (the watchdog's timeout, Locust stopping its user) takes
    its socket out of the epoll itself before the socket is released.

    Ended streams are woken in the order they ended, but only for ``WAKE_BUDGET_S`` of each loop
    round; the rest wait for the next round, which reads the sockets first. A woken greenlet
    records its request and sends the next one (closed loop): a few hundred microseconds. When a
    hundred streams end in the same round (closed-loop users started together stay in step),
    waking them all at once kept the loop from reading for tens of milliseconds, and the first
    chunks that arrived meanwhile were stamped late: TTFT p99 5.1-5.5 ms over the raw-socket
    reference at 256-384 streams without the budget, 2.9-3.5 ms with it (H200 host, same pass).
    The work, and the order of the sends, are the same; only the reads no longer wait behind it.
    """

    BLOCK = 65536
    WAKE_BUDGET_S = 0.0005

    def __init__(self):
        self.pid = os.getpid()
        self._epoll = _epoll()
        self._streams: dict[int, _Entry] = {}
        loop = gevent.get_hub().loop
        self._watcher = loop.io(self._epoll.fileno(), 1)
        self._watcher.start(self._on_ready)
        self._ended: deque = deque()    # waiters of ended streams not yet woken
        # a zero timer runs in the next loop round, after that round's reads (a loop callback
        # would run before the next poll)
        self._later = loop.timer(0.0)

    def wait(self, sock, reader: StreamReader) -> None:
        """Park the calling greenlet until ``reader``'s body is complete; re-raise its error."""
        fd = sock.fileno()
        entry = _Entry(sock._sock.recv, reader.data, Waiter())
        self._streams[fd] = entry
        self._epoll.register(fd, _EPOLLIN)
        try:
            entry.waiter.get()
        finally:
            if self._streams.get(fd) is entry:
                self._forget(fd)
        if entry.error is not None:
            raise entry.error

    def streams(self) -> int:
        return len(self._streams)

    def _forget(self, fd: int) -> None:
        del self._streams[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass  # closed meanwhile (the parser releases a socket it is done with)

    def _on_ready(self) -> None:
        now = time.perf_counter
        streams = self._streams
        ended = self._ended
        for fd, _ in self._epoll.poll(0):
            e = streams.get(fd)
            if e is None:
                continue
            try:
                data = e.recv(65536)   # BLOCK, inline on the hot path
                if not e.data(data, now()):
                    continue
            except (BlockingIOError, InterruptedError):
                continue
            except Exception as exc:  # noqa: BLE001 - the stream's outcome, raised in its greenlet
                e.error = exc
            self._forget(fd)
            ended.append(e.waiter)
        if ended:
            self._wake()

    def _wake(self) -> None:
        ended = self._ended
        now = time.perf_counter
        stop = now() + self.WAKE_BUDGET_S
        while ended:
            ended.popleft().switch(None)
            if now() >= stop:
                break
        if ended and not self._later.active:
            self._later.start(self._wake)

    def close(self) -> None:
        self._later.stop()
        self._later.close()
        self._watcher.stop()
        self._watcher.close()
        self._epoll.close()


_reactor: StreamReactor | None = None


def reactor() -> StreamReactor:
    """This process's reactor (a forked child makes its own)."""
    global _reactor
    if _reactor is None or _reactor.pid != os.getpid():
        _reactor = StreamReactor()
    return _reactor
