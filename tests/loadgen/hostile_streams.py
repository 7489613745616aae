"""The hostile kit's stream behaviours: how its chat/completions answers misbehave.

Each request is answered by one behaviour from ``BEHAVIOURS`` (hostile_server.py picks it:
the request's ``X-Hostile`` header, else the server's ``--behaviour``). ``EXPECTED`` is the
``error_kind`` servelab documents for each one (analysis/README.md, "How a request is
classified"); ``None`` is a success.
"""
from __future__ import annotations

import asyncio
import gzip
import json

from hostile_wire import HEAD, chunked

MODEL = "hostile"
TOKENS = 4          # content chunks of a normal answer


def chunk(rid: str, delta: dict | None = None, usage: dict | None = None, finish=None,
          choices: list | None = None, enc=None, **top) -> bytes:
    obj = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": 1,
           "model": MODEL}
    obj["choices"] = choices if choices is not None else [
        {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = usage
    obj.update(top)
    if enc is not None:
        return enc(obj).encode()
    return json.dumps(obj, separators=(",", ":")).encode()   # vLLM's compact form


def usage(prompt=3, completion=TOKENS, cached=None):
    u = {"prompt_tokens": prompt, "total_tokens": 0, "completion_tokens": completion}
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


def events(rid: str, n: int = TOKENS, enc=None, final_usage=None, chunk_usage=None,
           prefix=b"data: ", done=True, sep=b"\n\n", content=None) -> list[bytes]:
    """One normal stream's SSE events: role chunk, ``n`` content chunks, usage, [DONE]."""
    out = [chunk(rid, {"role": "assistant", "content": ""}, enc=enc)]
    for i in range(n):
        cu = chunk_usage(i) if chunk_usage else usage(completion=i + 1)
        text = content(i) if content else f"t{i}"
        out.append(chunk(rid, {"content": text}, cu, "length" if i == n - 1 else None,
                         enc=enc))
    out.append(chunk(rid, choices=[], usage=final_usage or usage(), enc=enc))
    if done:
        out.append(b"[DONE]")
    return [prefix + e + sep for e in out]


def spaced(obj) -> str:
    return json.dumps(obj)   # Python's default: a space after every colon and comma


def sorted_keys(obj) -> str:
    return json.dumps(obj, sort_keys=True, indent=None, separators=(", ", ": "))


def escaped(obj) -> str:
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


# ---- the behaviours: async fn(conn, rid) ---------------------------------------------------
async def ok(c, rid):
    await c.stream(events(rid))


async def b_spaced(c, rid):
    await c.stream(events(rid, enc=spaced))


async def b_sorted_nospace(c, rid):
    await c.stream(events(rid, enc=sorted_keys, prefix=b"data:"))


async def b_escapes(c, rid):
    await c.stream(events(rid, enc=escaped, content=lambda i: f'\u00e9"\\\n{i}\u4e2d'))


async def b_compact_nospace(c, rid):
    await c.stream(events(rid, prefix=b"data:"))


async def b_crlf(c, rid):
    await c.stream(events(rid, sep=b"\r\n\r\n"))


async def b_sse_fields(c, rid):
    parts = [b": keep-alive\n\n", b"event: message\nid: 1\nretry: 100\n\n"] + events(rid)
    await c.stream(parts)


async def b_fragmented(c, rid):
    body = b"".join(events(rid))
    await c.stream([body[i:i + 7] for i in range(0, len(body), 7)], gap=0.0005)


async def b_one_write(c, rid):
    await c.fixed(b"".join(events(rid)))


async def b_binary_content(c, rid):
    await c.stream(events(rid, content=lambda i: "\x00\x01\ud7ff" + chr(0x1F600)))


async def b_continue_100(c, rid):
    await c.send(b"HTTP/1.1 100 Continue\r\n\r\n")
    await c.stream(events(rid))


def _usage_case(**kw):
    async def fn(c, rid):
        await c.stream(events(rid, final_usage={**usage(), **kw}))
    return fn


async def b_cached_lots(c, rid):
    await c.stream(events(rid, final_usage=usage(cached="lots")))


async def b_chunk_count_huge(c, rid):
    await c.stream(events(rid, chunk_usage=lambda i: usage(completion=2**70 if i == 1 else i + 1)))


async def b_chunk_count_falls(c, rid):
    await c.stream(events(rid, chunk_usage=lambda i: usage(completion=5 - i)))


async def b_usage_not_object(c, rid):
    parts = events(rid)
    parts[-2] = b"data: " + chunk(rid, choices=[], usage="lots") + b"\n\n"
    await c.stream(parts)


async def b_zero_content(c, rid):
    await c.stream(events(rid, n=0))


async def b_zero_content_spaced(c, rid):
    await c.stream(events(rid, n=0, enc=spaced))


async def b_bad_chunk_size_with_head(c, rid):
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(events(rid)[:2])
                 + b"zz\r\nxx\r\n")
    c.close = True


async def b_bad_chunk_size_later(c, rid):
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    await asyncio.sleep(0.03)
    await c.send(chunked(events(rid)[:2]))
    await asyncio.sleep(0.03)
    await c.send(b"zz\r\nxx\r\n")
    c.close = True


async def b_content_length_long(c, rid):
    # the declared body is a whole stream; more bytes follow it on the wire
    body = b"".join(events(rid))
    await c.fixed(body + b"data: " + chunk(rid, {"content": "extra"}) + b"\n\n", length=len(body))


async def b_content_length_short(c, rid):
    body = b"".join(events(rid))
    await c.fixed(body, length=len(body) - 20)
    c.close = True


async def b_stray_bytes(c, rid):
    # in the same write as the body's end. Bytes that come only after the client sent its next
    # request are that request's answer to any client (a race no client can win): they are
    # classified by what they are (analysis/README.md), so the kit does not time them.
    await c.stream(events(rid), last=b"stray bytes on a keep-alive connection\r\n")


async def b_second_response(c, rid):
    other = b"".join(events("somebody-else"))
    await c.stream(events(rid), last=HEAD + b"Content-Length: %d\r\n\r\n" % len(other) + other)


async def b_wrong_id(c, rid):
    await c.stream(events("somebody-else"))


async def b_slowloris_head(c, rid):
    for b in b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Slow: yes":
        await c.send(bytes([b]))
        await asyncio.sleep(0.05)
    c.close = True


async def b_slowloris_body(c, rid):
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    line = events(rid)[1]
    for b in line:
        await c.send(chunked([bytes([b])]))
        await asyncio.sleep(0.05)
    c.close = True


async def b_stall(c, rid):
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(events(rid)[:3]))
    await asyncio.sleep(5)
    c.close = True


async def b_reset_mid_chunk(c, rid):
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(events(rid)[:2])
                 + b"40\r\ndata: {\"id\"")
    await asyncio.sleep(0.05)
    c.reset()


async def b_close_mid_chunk(c, rid):
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(events(rid)[:2])
                 + b"40\r\ndata: {\"id\"")
    c.close = True


async def b_no_done(c, rid):
    await c.stream(events(rid, done=False))


async def b_html_200(c, rid):
    await c.fixed(b"<html><body><h1>Welcome to nginx!</h1></body></html>\n",
                  head=b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")


async def b_json_200(c, rid):
    body = json.dumps({"id": f"chatcmpl-{rid}", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}}]}).encode()
    await c.fixed(body, head=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")


async def b_gzip_lie(c, rid):
    await c.fixed(gzip.compress(b"".join(events(rid))), head=HEAD + b"Content-Encoding: gzip\r\n")


async def b_gzip_header_plain(c, rid):
    await c.fixed(b"".join(events(rid)), head=HEAD + b"Content-Encoding: gzip\r\n")


async def b_huge_line(c, rid):
    big = b"data: " + chunk(rid, {"content": "x" * (6 << 20)}) + b"\n\n"
    await c.stream([big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)] + events(rid)[-1:])


async def b_error_event(c, rid):
    await c.stream(events(rid)[:2] + [b'data: {"error":{"message":"boom","code":500}}\n\n'])


async def b_not_json(c, rid):
    await c.stream(events(rid)[:2] + [b"data: hello there\n\n"] + events(rid)[2:])


async def b_data_array(c, rid):
    await c.stream(events(rid)[:2] + [b"data: [1, 2]\n\n"] + events(rid)[2:])


async def b_no_choices(c, rid):
    await c.stream(events(rid)[:2] + [b'data: {"id": "x", "object": "chunk"}\n\n']
                   + events(rid)[2:])


async def b_http500_html(c, rid):
    await c.fixed(b"<html>Internal Server Error</html>",
                  head=b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\n")


async def b_garbage_head(c, rid):
    await c.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    c.close = True


async def b_close_before_head(c, rid):
    c.close = True


async def b_reset_before_head(c, rid):
    c.reset()


async def b_te_and_length(c, rid):
    body = chunked(events(rid)) + b"0\r\n\r\n"
    await c.send(HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(body)
                 + body)
    c.close = True


BEHAVIOURS = {
    # valid streams in other encodings: successes, every chunk timed
    "ok": (ok, None),
    "spaced_json": (b_spaced, None),
    "sorted_keys_data_nospace": (b_sorted_nospace, None),
    "escapes": (b_escapes, None),
    "compact_data_nospace": (b_compact_nospace, None),
    "crlf_lines": (b_crlf, None),
    "sse_comments_and_fields": (b_sse_fields, None),
    "fragmented_writes": (b_fragmented, None),
    "one_write_content_length": (b_one_write, None),
    "binary_content": (b_binary_content, None),
    "continue_100": (b_continue_100, None),
    # bytes after a complete answer: the answer stands, the connection is not reused
    "content_length_long": (b_content_length_long, None),
    "stray_bytes_keepalive": (b_stray_bytes, None),
    "second_response": (b_second_response, None),
    # values that do not fit the row
    "usage_completion_3e9": (_usage_case(completion_tokens=3000000000), "bad_usage"),
    "usage_completion_1e23": (_usage_case(completion_tokens=1e23), "bad_usage"),
    "usage_completion_many": (_usage_case(completion_tokens="many"), "bad_usage"),
    "usage_prompt_negative": (_usage_case(prompt_tokens=-5), "bad_usage"),
    "usage_completion_bool": (_usage_case(completion_tokens=True), "bad_usage"),
    "usage_cached_lots": (b_cached_lots, "bad_usage"),
    "usage_not_object": (b_usage_not_object, "bad_usage"),
    "chunk_count_over_int64": (b_chunk_count_huge, "bad_usage"),
    "chunk_count_falls": (b_chunk_count_falls, "bad_usage"),
    # streams without output, or somebody else's
    "zero_content_chunks": (b_zero_content, "empty_stream"),
    "zero_content_spaced": (b_zero_content_spaced, "empty_stream"),
    "wrong_response_id": (b_wrong_id, "wrong_response"),
    # protocol broken after the 200 head
    "bad_chunk_size_with_head": (b_bad_chunk_size_with_head, "malformed_http"),
    "bad_chunk_size_later": (b_bad_chunk_size_later, "malformed_http"),
    "content_length_short": (b_content_length_short, "malformed_sse"),  # ends mid-line
    "reset_mid_chunk": (b_reset_mid_chunk, "stream_cut"),
    "close_mid_chunk": (b_close_mid_chunk, "stream_cut"),
    "no_done": (b_no_done, "stream_cut"),
    "html_200": (b_html_200, "malformed_sse"),
    "json_200": (b_json_200, "malformed_sse"),
    "huge_line": (b_huge_line, "malformed_sse"),
    "gzip_lie": (b_gzip_lie, "malformed_encoding"),
    "gzip_header_plain_body": (b_gzip_header_plain, "malformed_encoding"),
    "error_event": (b_error_event, "error_event"),
    "data_not_json": (b_not_json, "malformed_json"),
    "data_json_array": (b_data_array, "malformed_json"),
    "chunk_without_choices": (b_no_choices, "malformed_json"),
    # timing
    "slowloris_head": (b_slowloris_head, "timeout_first_token"),
    "slowloris_body": (b_slowloris_body, "timeout_first_token"),
    "stall_after_content": (b_stall, "timeout_between_chunks"),
    # before (or instead of) a head
    "http500_html": (b_http500_html, "http_500"),
    "garbage_head": (b_garbage_head, "malformed_http"),
    "te_and_content_length": (b_te_and_length, "malformed_http"),
    "close_before_head": (b_close_before_head, "connect_reset"),
    "reset_before_head": (b_reset_before_head, "connect_reset"),
}
EXPECTED = {name: kind for name, (_, kind) in BEHAVIOURS.items()}
