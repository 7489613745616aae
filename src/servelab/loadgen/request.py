"""One streamed LLM request over a Locust FastHttpUser's connection pool, timed and classified.

``execute`` never raises for anything the server or the network does: a refused connection, a
timeout, an HTTP error, an error frame inside a 200 stream, a cut or malformed stream all come
back as an outcome with a stable ``error_kind``. Locust gets exactly one request event per LLM
request: name = the profile's class, response_time = E2E in ms, response_length = output tokens.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass

import gevent
import orjson
from gevent import monkey
from geventhttpclient.connectionpool import ConnectionPool
from locust.contrib.fasthttp import FastResponse
from locust.exception import CatchResponseError

from servelab.loadgen.clock import to_unix
from servelab.loadgen.stream import StreamState, read_stream
from servelab.loadgen.watchdog import StreamTimeout, Watchdog
from servelab.loadgen.wire import Wire

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

    def __init__(self, base_url: str, chat: bool, model: str | None):
        self.base_url = base_url.rstrip("/")
        self.chat = chat
        self.path = "/v1/chat/completions" if chat else "/v1/completions"
        self.model = model
        # Older servers reject continuous_usage_stats with a 400: after one such answer this
        # target is asked for include_usage only.
        self.continuous_ok = True


@dataclass
class RequestSpec:
    request_id: str
    class_name: str
    body: dict                      # model, messages|prompt, max_tokens, sampling; no stream keys
    prompt_tokens_target: int | None = None
    prompt_tokens_estimate: int | None = None
    output_tokens_target: int | None = None


class Outcome:
    """The measured result, with times already converted to Unix epoch seconds."""

    __slots__ = ("sent_unix", "first_token_unix", "last_token_unix", "done_unix", "ttft_ms",
                 "e2e_ms", "chunk_offsets_ms", "chunk_tokens", "chunk_token_source",
                 "prompt_tokens", "output_tokens", "token_source", "cached_tokens",
                 "finish_reason", "http_status", "error_kind", "error_text", "response_id",
                 "t_sent", "aborted")

    def as_columns(self) -> dict:
        return dict(zip(_COLUMNS, _columns(self)))


_COLUMNS = tuple(k for k in Outcome.__slots__ if k not in ("t_sent", "aborted"))
_columns = operator.attrgetter(*_COLUMNS)


def execute(session, target: Target, spec: RequestSpec, watchdog: Watchdog,
            texts: list | None = None) -> Outcome:
    """Send ``spec`` and read its stream; retry once without continuous usage if refused.

    A GreenletExit (Locust stopping the user) ends the request as ``aborted``; the outcome is
    returned with ``aborted`` set so the caller records it before letting the exit go on.
    """
    continuous = target.continuous_ok
    out = _attempt(session, target, spec, watchdog, continuous, texts)
    if continuous and out.http_status == 400:
        # Whatever the message says: if the same request passes without continuous usage, the
        # option was the problem, and this target is not asked for it again.
        retry = _attempt(session, target, spec, watchdog, False, texts)
        if retry.http_status != 400:
            target.continuous_ok = False
            return retry
    return out


def _attempt(session, target: Target, spec: RequestSpec, watchdog: Watchdog,
             continuous: bool, texts: list | None) -> Outcome:
    body = dict(spec.body)
    body["stream"] = True
    body["stream_options"] = _CONTINUOUS if continuous else _USAGE_ONLY
    data = orjson.dumps(body)
    wire = None
    if texts is not None:
        texts.clear()
    state = StreamState()
    out = Outcome()
    out.aborted = None
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
            _flag(state, *_classify_exception(exc, False))
        else:
            status = raw.get_code()
            if status != 200:
                _flag(state, f"http_{status}", _body_excerpt(raw))
            else:
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
    except gevent.GreenletExit as exc:
        state.error_kind = None
        _flag(state, "aborted", "the load generator stopped this request")
        out.aborted = exc
    finally:
        watchdog.release()
    t_done = time.perf_counter()
    _fill(out, state, spec, status, t_sent, t_done)
    _report(session, target, wire, spec, out, state, raw, start_time, t_done)
    return out


def _wire(session, target: Target) -> Wire:
    wire = getattr(session, "_servelab_wire", None)
    if wire is None or wire.path != target.path:
        wire = Wire(session, session.base_url or target.base_url, target.path)
        session._servelab_wire = wire
    return wire


def _report(session, target: Target, wire: Wire | None, spec: RequestSpec, out: Outcome,
            state: StreamState, raw, start_time: float, t_done: float) -> None:
    """One Locust entry per LLM request: E2E and output tokens, not time-to-headers."""
    exception = None
    if state.error_kind:
        exception = CatchResponseError(f"{state.error_kind}: {(state.error_text or '')[:200]}")
    user = session.user
    session.request_event.fire(
        request_type="POST", name=spec.class_name,
        response_time=(out.e2e_ms if out.e2e_ms is not None
                       else (t_done - out.t_sent) * 1000.0),
        response_length=out.output_tokens or 0, exception=exception,
        context=user.context() if user is not None else {},
        response=FastResponse(raw) if raw is not None else None,
        start_time=start_time,
        url=wire.url_text if wire is not None else f"{session.base_url}{target.path}")


def _fill(out: Outcome, state: StreamState, spec: RequestSpec, status: int, t_sent: float,
          t_done: float) -> None:
    stamps = state.stamps
    out.t_sent = t_sent
    out.sent_unix = to_unix(t_sent)
    out.done_unix = to_unix(t_done)
    out.http_status = status or None
    out.response_id = state.response_id
    out.finish_reason = state.finish_reason
    out.error_kind = state.error_kind
    out.error_text = state.error_text
    if stamps:
        out.first_token_unix = to_unix(stamps[0])
        out.last_token_unix = to_unix(stamps[-1])
        out.ttft_ms = (stamps[0] - t_sent) * 1000.0
        out.e2e_ms = (stamps[-1] - t_sent) * 1000.0
        out.chunk_offsets_ms = [(t - t_sent) * 1000.0 for t in stamps]
    else:
        out.first_token_unix = out.last_token_unix = out.ttft_ms = out.e2e_ms = None
        out.chunk_offsets_ms = []
    usage = state.usage
    if state.continuous and len(state.tokens) == len(stamps) and stamps:
        out.chunk_tokens = state.tokens.tolist()
        out.chunk_token_source = "usage"
    else:
        out.chunk_tokens = [1] * len(stamps)  # one token per chunk: vLLM's norm without spec decode
        out.chunk_token_source = "estimated" if stamps else None
    cached = None
    if usage:
        out.prompt_tokens = usage.get("prompt_tokens")
        out.output_tokens = usage.get("completion_tokens")
        out.token_source = "usage"
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = details.get("cached_tokens")
    else:
        out.prompt_tokens = spec.prompt_tokens_estimate
        out.output_tokens = sum(out.chunk_tokens)
        out.token_source = "estimated"
    out.cached_tokens = cached


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
        if isinstance(exc, OSError) or type(exc).__name__ in (
                "HTTPConnectionClosed", "HTTPParseError", "ConnectionError"):
            return "connect_reset", text
        return "client_error", text
    if is_timeout:
        return "timeout_between_chunks", text
    if isinstance(exc, OSError) or type(exc).__name__ in (
            "HTTPConnectionClosed", "HTTPParseError", "HTTPProtocolViolationError"):
        return "stream_cut", text
    return "client_error", text


def _raised_in_connect(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in _CONNECT_FRAMES:
            return True
        tb = tb.tb_next
    return False
