"""The slow path of the SSE reader: chunks decoded in full, and the checks on what they carry.

``stream.StreamReader`` classifies a vLLM chunk with a few byte finds; everything those finds do
not take for output comes here (role, usage, finish-only and error chunks, anything odd, and
content chunks in another JSON encoding), at most a few per request from vLLM, every chunk from
a server that spaces its JSON. Token counts are checked here too: what enters an INTEGER column
is a non-negative int within its range, anything else is recorded as a bad value.
"""
from __future__ import annotations

import orjson

FINISH = b'"finish_reason":"'
# usage counts enter INTEGER columns: anything else is a bad value, stored as NULL with a reason
COUNT_MAX = 2**31 - 1


def other_chunk(state, line: bytes, prev_completion: int, t: float, reader) -> int:
    """A data line the finds did not take for output: role, usage, finish-only, error, odd, or
    a content chunk in another JSON encoding than vLLM's (decoded here, and timed the same)."""
    try:
        obj = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        flag(state, "malformed_json", "invalid JSON: " + excerpt(line))
        return prev_completion
    if not isinstance(obj, dict):
        flag(state, "malformed_json", "a data line that is no JSON object: " + excerpt(line))
        return prev_completion
    if state.response_id is None and isinstance(obj.get("id"), str):
        state.response_id = obj["id"]
    if "error" in obj or obj.get("object") == "error":
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        flag(state, "error_event", str(msg)[:500])
        return prev_completion
    choices = obj.get("choices")
    if not isinstance(choices, list):
        flag(state, "malformed_json", "a chunk without choices: " + excerpt(line))
        return prev_completion
    usage = obj.get("usage")
    output = None
    for c in choices:
        if not isinstance(c, dict):
            continue
        fr = c.get("finish_reason")
        if fr and isinstance(fr, str):
            state.finish_reason = fr
        output = output or _output_text(c, reader.chat)
    if output:
        state.stamps.append(t)
        if reader.texts is not None:
            reader.texts.append(output)
        if state.first_token is None:
            state.first_token = t
        if isinstance(usage, dict) and "completion_tokens" in usage:
            return chunk_count(state, usage["completion_tokens"], prev_completion)
        state.continuous = False
        return prev_completion
    if usage is not None and not isinstance(usage, dict):
        _bad(state, f"usage={_short(usage)} is no object")
    elif isinstance(usage, dict):
        if choices:
            # a role or finish-only chunk with continuous usage: keep the running count
            if "completion_tokens" in usage:
                n = count_value(usage["completion_tokens"])
                if n is None:
                    _bad(state, f"completion_tokens={_short(usage['completion_tokens'])} "
                         "is no count")
                    state.continuous = False
                else:
                    prev_completion = n
        else:
            state.usage = usage
    return prev_completion


def _output_text(choice: dict, chat: bool):
    part = choice.get("delta") if chat else choice
    if not isinstance(part, dict):
        return None
    for key in (("content", "reasoning_content", "reasoning") if chat else ("text",)):
        v = part.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def count_value(v) -> int | None:
    """``v`` as a token count for an INTEGER column, or None when it is not one."""
    if type(v) is int and 0 <= v <= COUNT_MAX:
        return v
    return None


def chunk_count(state, raw, prev: int) -> int:
    """A content chunk's cumulative completion count (bytes from the fast path, or a decoded
    value): its own tokens are the rise since the previous one. A count that is no integer in
    range, or that falls, voids the per-chunk counts (they become estimates) with a reason."""
    n = raw
    if isinstance(raw, (bytes, bytearray)):
        try:
            n = int(raw)
        except ValueError:
            n = None
    n = count_value(n) if n is not None else None
    if n is None or n < prev:
        _bad(state, f"chunk completion_tokens={_short(raw)} after {prev}")
        state.continuous = False
        return prev
    state.tokens.append(n - prev)
    return n


def _bad(state, why: str) -> None:
    if state.quality is None:
        state.quality = []
    if len(state.quality) < 4:
        state.quality.append(why)


def _short(v, n: int = 40) -> str:
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).decode("utf-8", "replace").strip()
    text = v if isinstance(v, str) else repr(v)
    return text[:n]


def chunk_text(line: bytes, chat: bool) -> str:
    try:
        choice = orjson.loads(line[5:])["choices"][0]
        part = choice["delta"] if chat else choice
        return part.get("content") or part.get("text") or part.get("reasoning_content") or ""
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return ""


def flag(state, kind: str, text: str) -> None:
    if state.error_kind is None:
        state.error_kind = kind
        state.error_text = text


def excerpt(line: bytes, n: int = 200) -> str:
    return bytes(line[:n]).decode("utf-8", "replace").rstrip("\r\n")


def finish_reason_of(line: bytes) -> str | None:
    j = line.find(FINISH) + len(FINISH)
    return line[j:line.find(b'"', j)].decode()


def response_id_of(line: bytes) -> str | None:
    j = line.find(b'"id":"')
    if j < 0:
        return None
    j += 6
    return line[j:line.find(b'"', j)].decode()
