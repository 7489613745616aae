"""The stream reader's own HTTP body framing (client/framing.py) and its one-chunk fast path
(client/stream.py): every split of the wire gives the same body and the same measurement.

The reader runs on a real socket pair: the response head goes through ``OneResponse`` (which
parses the head and leaves the body alone), then the body is handed to ``StreamReader.data`` the
way the reactor hands it each network read, with that read's stamp.
"""
import random
import socket

import gevent.socket
import orjson
import pytest
from geventhttpclient.response import HTTPParseError

from servelab.loadgen.client.framing import Framing
from servelab.loadgen.client.response import OneResponse
from servelab.loadgen.client.stream import StreamReader, StreamState

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


def event(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def events(n: int) -> list[bytes]:
    """A vLLM chat stream: role chunk, ``n`` content chunks with continuous usage, usage, DONE."""
    out = [event({"id": "r-1", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                  "content": ""}}],
                  "usage": {"prompt_tokens": 7, "completion_tokens": 0}})]
    for i in range(1, n + 1):
        out.append(event({"id": "r-1", "choices": [{"index": 0, "delta": {"content": " tok"},
                                                    "finish_reason": "length" if i == n
                                                    else None}],
                          "usage": {"prompt_tokens": 7, "completion_tokens": i}}))
    out.append(event({"id": "r-1", "choices": [],
                      "usage": {"prompt_tokens": 7, "completion_tokens": n}}))
    out.append(b"data: [DONE]\n\n")
    return out


def chunked(parts: list[bytes], ext: bool = False) -> list[bytes]:
    return [b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if ext else b"", p) for p in parts]


def take_all(framing: Framing, reads: list[bytes]) -> bytes:
    return b"".join(framing.take(r) for r in reads)


def test_chunked_body_at_every_split():
    body_parts = events(6)
    body = b"".join(body_parts)
    # events across chunk boundaries, two events in one chunk, chunk extensions, a trailer
    parts = [body[:10], body[10:300], body[300:301], body[301:]]
    for wire in (b"".join(chunked(body_parts)) + b"0\r\n\r\n",
                 b"".join(chunked(parts, ext=True)) + b"0\r\nX-Trailer: 1\r\n\r\n"):
        for cut in range(1, len(wire)):   # every two-read split
            f = Framing(True, None)
            assert take_all(f, [wire[:cut], wire[cut:]]) == body
            assert f.complete and not f.trailing
        f = Framing(True, None)   # one byte a read
        assert take_all(f, [wire[i:i + 1] for i in range(len(wire))]) == body
        assert f.complete and not f.trailing
        rnd = random.Random(7)
        for _ in range(50):
            cuts = sorted(rnd.sample(range(1, len(wire)), 5))
            reads = [wire[a:b] for a, b in zip([0] + cuts, cuts + [len(wire)])]
            f = Framing(True, None)
            assert take_all(f, reads) == body and f.complete


@pytest.mark.parametrize("wire", [
    b"zz\r\nab\r\n0\r\n\r\n",          # no hex
    b"-2\r\nab\r\n0\r\n\r\n",          # a sign
    b"2\r\nabXY0\r\n\r\n",             # no CRLF after the chunk's data
    b"1_0\r\n" + b"a" * 16 + b"\r\n",  # int() would take the underscore
    b"f" * 70000,                      # a size line that never ends
])
def test_broken_framing_is_an_http_error(wire):
    f = Framing(True, None)
    with pytest.raises(HTTPParseError):
        take_all(f, [wire[:3], wire[3:]])


def test_bytes_after_the_body_and_fixed_lengths():
    f = Framing(True, None)
    assert f.take(b"2\r\nab\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n") == b"ab"
    assert f.complete and f.trailing
    f = Framing(True, None)
    f.take(b"2\r\nab\r\n0\r\n\r\n")
    assert f.complete and not f.trailing
    assert f.take(b"stray") == b"" and f.trailing   # a later read
    f = Framing(False, 5)
    assert take_all(f, [b"ab", b"cd"]) == b"abcd" and not f.complete
    assert f.take(b"efgh") == b"e" and f.complete and f.trailing
    f = Framing(False, None)   # delimited by the close
    assert take_all(f, [b"ab", b"cd"]) == b"abcd" and not f.complete
    assert f.closed() and f.complete
    assert not Framing(False, 5).closed()   # a close before the length is a cut
    assert not Framing(True, None).closed()


def response(head: bytes = HEAD) -> OneResponse:
    a, b = socket.socketpair()
    a.sendall(head)
    a.close()
    sock = gevent.socket.socket(fileno=b.detach())
    return OneResponse(sock, None, block_size=65536, method="POST")


def measure(reads: list[bytes]) -> StreamState:
    """The reader fed ``reads``, read ``i`` stamped ``i``."""
    state = StreamState()
    reader = StreamReader(response(), state, chat=True)
    ended = [reader.data(r, float(i)) for i, r in enumerate(reads)]
    assert ended[-1] and not any(ended[:-1])
    return state


def test_fast_path_and_general_path_measure_the_same():
    n = 12
    wire = chunked(events(n)) + [b"0\r\n\r\n"]
    whole = b"".join(wire)
    one_chunk_a_read = measure(wire)   # the fast path: each read one whole chunk
    # content chunk i (1-based) is wire[i]: read i stamps it
    assert list(one_chunk_a_read.stamps) == [float(i) for i in range(1, n + 1)]
    one_read = measure([whole])
    assert list(one_read.stamps) == [0.0] * n
    bytewise = measure([whole[i:i + 1] for i in range(len(whole))])
    for st in (one_chunk_a_read, one_read, bytewise):
        assert st.error_kind is None, st.error_text
        assert list(st.tokens) == [1] * n and st.continuous
        assert st.usage == {"prompt_tokens": 7, "completion_tokens": n}
        assert st.done and st.finish_reason == "length" and st.response_id == "r-1"
    # each content chunk is stamped by the read that completed its line: the first LF of the
    # "\n\n\r\n" that ends its HTTP chunk
    ends = []
    pos = 0
    for piece in wire:
        pos += len(piece)
        ends.append(pos)
    assert list(bytewise.stamps) == [float(ends[i] - 4) for i in range(1, n + 1)]


def test_the_response_head_leaves_the_body_to_the_reader():
    body = b"".join(chunked(events(2))) + b"0\r\n\r\n"
    raw = response(b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + body[:40])
    assert raw.get_code() == 200 and raw.rest == body[:40]
    assert bytes(raw._body_buffer) == b""   # the parser saw the head only
    state = StreamState()
    reader = StreamReader(raw, state, chat=True)
    assert not reader.data(raw.rest, 0.0)
    assert reader.data(body[40:], 1.0)
    assert len(state.stamps) == 2 and state.done and raw._sock is None
    # an error answer's body still goes through the parser
    err = b'{"error": "bad"}'
    raw = response(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(err), err))
    assert raw.get_code() == 500 and raw.read() == err


def test_reads_of_several_whole_chunks_then_a_cut_one():
    """The fast path takes the whole one-event chunks at the start of a read and leaves the rest
    (a chunk cut by the read, two events in one chunk, the last chunk) to the general path: at
    any cuts, each content chunk is stamped by the read that completed its line."""
    n = 12
    parts = events(n)
    # two events in one HTTP chunk, and a chunk extension: not the fast path's shape
    parts[4:6] = [parts[4] + parts[5]]
    wire = chunked(parts[:7]) + [b"%x;x=1\r\n%s\r\n" % (len(parts[7]), parts[7])] \
        + chunked(parts[8:]) + [b"0\r\n\r\n"]
    whole = b"".join(wire)
    lf = []   # where each content chunk's line ends, in the wire
    pos = 0
    for piece in wire:
        start = pos
        pos += len(piece)
        at = piece.find(b"\n\n")
        while at >= 0:
            if b'"content":" tok"' in piece[:at]:
                lf.append(start + at)
            at = piece.find(b"\n\n", at + 2)
    assert len(lf) == n
    rnd = random.Random(11)
    for _ in range(200):
        cuts = sorted(rnd.sample(range(1, len(whole)), rnd.randint(1, 6)))
        bounds = [0] + cuts + [len(whole)]
        reads = [whole[a:b] for a, b in zip(bounds, bounds[1:])]
        st = measure(reads)
        assert st.error_kind is None, st.error_text
        want = [float(next(i for i, b in enumerate(bounds[1:]) if p < b)) for p in lf]
        assert list(st.stamps) == want
        assert list(st.tokens) == [1] * n and st.done and st.usage["completion_tokens"] == n
