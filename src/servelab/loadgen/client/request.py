"""One streamed LLM request over a FastHttpSession's connection pool, timed and classified.

``execute`` never raises for anything the server or the network does: a refused connection, a
timeout, an HTTP error, an error frame inside a 200 stream, a cut or malformed stream all come
back as an outcome with a stable ``error_kind``. The measurement goes straight into the
``RequestRow`` the worker records (``store.rows``), so no dict is built per request. Each
attempt is handed to ``report`` (Locust's request event, ``loadgen.users.report_request``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import gevent
import numpy as np
import orjson
from gevent import monkey
from geventhttpclient.connectionpool import ConnectionPool

from servelab.core import credentials
from servelab.loadgen.client.clock import to_unix
from servelab.loadgen.client.chunks import count_value
from servelab.loadgen.client.stream import StreamState, read_stream
from servelab.loadgen.client.watchdog import StreamTimeout, Watchdog
from servelab.loadgen.client.wire import Wire
from servelab.store.rows import RequestRow

ALL_STATUSES = frozenset(range(100, 600))
_CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
_USAGE_ONLY = {"include_usage": True}


def _socket_alive(self, sock) -> bool:
    """geventhttpclient's keep-alive check without gevent's ``select``, which yields to the hub
    even with a zero timeout: between stamping ``t_sent`` and the request reaching the wire the
    greenlet then waited behind every runnable greenlet, adding 1-2 ms to TTFT at 32 streams and
    tens at bursts (measured with the calibration server's own arrival times)."""
    if sock is None:
        return False
    try:
        if sock.fileno() < 0:
            return False
        readable, _, _ = _select([sock], [], [], 0.0)
        return not readable
    except (OSError, ValueError):
        return False


_select = monkey.get_original("select", "select")
ConnectionPool._is_socket_alive = _socket_alive
_CONNECT_FRAMES = {"_create_socket", "_connect_socket", "create_connection", "get_socket"}


class Target:
    """What this process has learnt about the server under test."""

    def __init__(self, base_url: str, chat: bool, model: str | None,
                 id_field: str | None = None):
        self.base_url = base_url.rstrip("/")
        # SGLang names a request (and its spans) by the body's `rid`, not the X-Request-Id
        # header: for such a target servelab's id goes in the body too.
        self.id_field = id_field
        self.chat = chat
        self.path = "/v1/chat/completions" if chat else "/v1/completions"
        self.model = model
        # Older servers reject continuous_usage_stats with a 400: after one such answer this
        # target is asked for include_usage only.
        self.continuous_ok = True
        # vLLM names its response after the X-Request-Id (chatcmpl-<id>): once this target has
        # echoed one, a response naming another request is somebody else's answer.
        self.echoes_id = False


@dataclass
class RequestSpec:
    request_id: str
    class_name: str
    body: dict                      # model, messages|prompt, max_tokens, sampling; no stream keys
    prompt_tokens_target: int | None = None
    prompt_tokens_estimate: int | None = None
    output_tokens_target: int | None = None


class Outcome:
    """The measured request: its row (the measurement columns filled in, times in Unix epoch
    seconds), when it was sent (``perf_counter``) and the GreenletExit that ended it, if any."""

    __slots__ = ("row", "t_sent", "aborted")

    def __init__(self, row: RequestRow, t_sent: float, aborted: BaseException | None):
        self.row = row
        self.t_sent = t_sent
        self.aborted = aborted


def execute(session, target: Target, spec: RequestSpec, watchdog: Watchdog,
            texts: list | None = None, report=None) -> Outcome:
    """Send ``spec`` and read its stream; retry once without continuous usage if refused.

    A GreenletExit (Locust stopping the user) ends the request as ``aborted``; the outcome is
    returned with ``aborted`` set so the caller records it before letting the exit go on.
    ``report(session, name, e2e_ms, output_tokens, failure, raw, start_time, url)`` is called
    once per attempt (``failure``: None, or the error kind and text).
    """
    continuous = target.continuous_ok
    out = _attempt(session, target, spec, watchdog, continuous, texts, report)
    if continuous and out.row.http_status == 400:
        # Whatever the message says: if the same request passes without continuous usage, the
        # option was the problem, and this target is not asked for it again.
        retry = _attempt(session, target, spec, watchdog, False, texts, report)
        if retry.row.http_status != 400:
            target.continuous_ok = False
            return retry
    return out


def _attempt(session, target: Target, spec: RequestSpec, watchdog: Watchdog,
             continuous: bool, texts: list | None, report) -> Outcome:
    body = dict(spec.body)
    body["stream"] = True
    body["stream_options"] = _CONTINUOUS if continuous else _USAGE_ONLY
    if target.id_field:
        body[target.id_field] = spec.request_id
    data = orjson.dumps(body)
    wire = None
    if texts is not None:
        texts.clear()
    state = StreamState()
    aborted = None
    status = 0
    raw = None
    start_time = time.time()
    t_sent = time.perf_counter()
    watchdog.watch(state, t_sent)
    try:
        try:
            wire = _wire(session, target)
            raw = wire.send(data, spec.request_id)
        except gevent.GreenletExit:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is an outcome
            status = getattr(exc, "servelab_status", 0)
            _flag(state, *_classify_exception(exc, bool(status)))
        else:
            status = raw.get_code()
            if status != 200:
                _flag(state, f"http_{status}", _body_excerpt(raw))
            else:
                encoding = raw.get("content-encoding")
                if encoding and encoding.lower() != "identity":
                    # asked for identity: a compressed body is no stream this reader can time
                    _flag(state, "malformed_encoding", f"Content-Encoding: {encoding}"[:200])
                try:
                    read_stream(raw, state, target.chat, texts)
                except gevent.GreenletExit:
                    raw.release()
                    raise
                except BaseException as exc:  # noqa: BLE001 - every failure is an outcome
                    state.error_kind = None  # the transport failure explains the stream
                    _flag(state, *_classify_exception(exc, True))
                    raw.release()
                else:
                    if not state.done and state.error_kind is None:
                        _flag(state, "stream_cut", "the body ended before [DONE]")
                    _judge(state, target, spec.request_id)
    except gevent.GreenletExit as exc:
        state.error_kind = None
        _flag(state, "aborted", "the load generator stopped this request")
        aborted = exc
    finally:
        watchdog.release()
    t_done = time.perf_counter()
    row = _measured(state, spec, status, t_sent, t_done)
    if row.data_quality is not None and row.error_kind is None:
        row.error_kind = "bad_usage"
        row.error_text = row.data_quality[len("bad_usage: "):]
    if report is not None:
        # One entry per attempt: E2E (or the time to the failure) and output tokens.
        failure = f"{state.error_kind}: {(state.error_text or '')[:200]}" \
            if state.error_kind else None
        e2e_ms = row.e2e_ms if row.e2e_ms is not None else (t_done - t_sent) * 1000.0
        url = wire.url_text if wire is not None else f"{session.base_url}{target.path}"
        report(session, spec.class_name, e2e_ms, row.output_tokens or 0, failure, raw,
               start_time, url)
    return Outcome(row, t_sent, aborted)


def _wire(session, target: Target) -> Wire:
    wire = getattr(session, "_servelab_wire", None)
    if wire is None or wire.path != target.path:
        wire = Wire(session, session.base_url or target.base_url, target.path)
        session._servelab_wire = wire
    return wire


def _measured(state: StreamState, spec: RequestSpec, status: int, t_sent: float,
              t_done: float) -> RequestRow:
    stamps = state.stamps
    out = RequestRow()
    out.sent_unix = to_unix(t_sent)
    out.done_unix = to_unix(t_done)
    out.http_status = status or None
    out.response_id = state.response_id
    out.finish_reason = state.finish_reason
    out.error_kind = state.error_kind
    # A server may echo the key back in its error body; nothing servelab stores may hold it.
    out.error_text = credentials.current().redact(state.error_text) if state.error_text else None
    quality = list(state.quality) if state.quality else []
    if stamps:
        out.first_token_unix = to_unix(stamps[0])
        out.last_token_unix = to_unix(stamps[-1])
        out.ttft_ms = (stamps[0] - t_sent) * 1000.0
        out.e2e_ms = (stamps[-1] - t_sent) * 1000.0
        # one numpy pass over the array's buffer: a list comprehension cost 2% of the event loop
        out.chunk_offsets_ms = ((np.frombuffer(stamps) - t_sent) * 1000.0).tolist()
    usage = state.usage
    if state.continuous and len(state.tokens) == len(stamps) and stamps:
        out.chunk_tokens = state.tokens.tolist()
        out.chunk_token_source = "usage"
    else:
        out.chunk_tokens = [1] * len(stamps)  # one token per chunk: vLLM's norm without spec decode
        if stamps:
            out.chunk_token_source = "estimated"
    cached = None
    if usage:
        out.prompt_tokens = _count(usage, "prompt_tokens", quality)
        out.output_tokens = _count(usage, "completion_tokens", quality)
        out.token_source = "usage"
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = _count(details, "cached_tokens", quality)
        elif details is not None:
            quality.append(f"prompt_tokens_details={_short(details)} is no object")
    else:
        out.prompt_tokens = spec.prompt_tokens_estimate
        out.output_tokens = sum(out.chunk_tokens)
        out.token_source = "estimated"
    out.cached_tokens = cached
    if quality:
        out.data_quality = ("bad_usage: " + "; ".join(quality))[:500]
    return out


def _count(obj: dict, key: str, quality: list) -> int | None:
    """A usage count as stored (an int within INTEGER), else NULL with the reason in ``quality``."""
    v = obj.get(key)
    if v is None:
        return None
    n = count_value(v)
    if n is None:
        quality.append(f"{key}={_short(v)} out of range" if type(v) is int
                       else f"{key}={_short(v)} is no count")
    return n


def _short(v, n: int = 40) -> str:
    return (v if isinstance(v, str) else repr(v))[:n]


def _judge(state: StreamState, target: Target, request_id: str) -> None:
    """What a complete stream still has to pass: its answer is this request's, and it had output."""
    rid = state.response_id
    if rid is not None:
        if rid == request_id or rid.endswith("-" + request_id):
            target.echoes_id = True
        elif target.echoes_id:
            _flag(state, "wrong_response", f"response id {rid[:100]!r} is not this request's "
                  f"({request_id})")
    if not state.stamps:
        _flag(state, "empty_stream", "the stream ended without a content chunk"
              + (f" (finish_reason {state.finish_reason})" if state.finish_reason else ""))


def _flag(state: StreamState, kind: str, text: str) -> None:
    if state.error_kind is None:
        state.error_kind = kind
        state.error_text = text


def _body_excerpt(raw, limit: int = 500) -> str:
    if raw is None:
        return ""
    try:
        body = raw.read(64 * 1024)
    except Exception as exc:  # noqa: BLE001 - the status is the finding; the body is a bonus
        return f"(body unreadable: {exc!r})"
    finally:
        raw.release()
    return body[:limit].decode("utf-8", "replace")


def _classify_exception(exc: BaseException, in_stream: bool) -> tuple[str, str]:
    original = getattr(exc, "original", None)  # geventhttpclient's RetriesExceeded wraps it
    if original is not None:
        exc = original
    if isinstance(exc, StreamTimeout):
        return exc.kind, exc.text
    text = f"{type(exc).__name__}: {exc}"[:500]
    is_timeout = isinstance(exc, (TimeoutError, gevent.Timeout))
    if not in_stream:
        if isinstance(exc, ConnectionRefusedError):
            return "connect_refused", text
        if _raised_in_connect(exc):
            return ("timeout_connect" if is_timeout else "connect_error"), text
        if is_timeout:
            return "timeout_first_token", text
        if type(exc).__name__ in ("HTTPParseError", "HTTPProtocolViolationError") \
                and "closed" not in str(exc):
            return "malformed_http", text   # what came back is no HTTP response head
        if isinstance(exc, OSError) or type(exc).__name__ in (
                "HTTPConnectionClosed", "HTTPParseError", "ConnectionError"):
            return "connect_reset", text
        return "client_error", text
    if is_timeout:
        return "timeout_between_chunks", text
    if type(exc).__name__ in ("HTTPParseError", "HTTPProtocolViolationError"):
        # the framing the server sent after its 200 head (a bad chunk size, a broken trailer)
        return "malformed_http", text
    if isinstance(exc, OSError) or type(exc).__name__ == "HTTPConnectionClosed":
        return "stream_cut", text
    return "client_error", text


def _raised_in_connect(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in _CONNECT_FRAMES:
            return True
        tb = tb.tb_next
    return False
