"""One request as the server sees it: its accounting (``ServerRecord``, served at
``GET /sim/requests``) and its delivery to the client (``RequestStream``: SSE frames written
straight to the socket, stream faults applied). ``realtime.EngineDriver`` feeds the streams."""
from __future__ import annotations

import asyncio
import time
from array import array

from servelab.sim.server.metrics import EngineMetrics
from servelab.sim.server.protocol import DONE_FRAME, ChunkFormat, error_frame
from servelab.sim.server.textgen import OutputText

# A client that stops reading gets aborted once this much is queued for it.
MAX_CLIENT_BUFFER = 8 << 20
clock = time.perf_counter


class ServerRecord:
    """Server-side accounting of one request (served at ``GET /sim/requests``)."""

    __slots__ = ("seq", "request_id", "x_request_id", "engine_id", "kind", "model", "engine",
                 "stream", "status", "arrival",
                 "first_token", "finished", "chunk_times", "chunk_tokens", "prompt_tokens",
                 "output_tokens", "cached_tokens", "max_tokens", "finish_reason", "fault", "error")

    def __init__(self, request_id: str, kind: str, model: str, arrival: float, stream: bool,
                 prompt_tokens: int, max_tokens: int, x_request_id: str | None = None,
                 engine_id: str | None = None):
        self.seq = 0
        self.request_id = request_id      # the response id, as the client sees it
        self.x_request_id = x_request_id  # the caller's X-Request-Id header, when sent
        # The engine's key: unique even when callers reuse an X-Request-Id.
        self.engine_id = engine_id or request_id
        self.kind = kind
        self.model = model
        self.engine = None
        self.stream = stream
        self.status = 200
        self.arrival = arrival            # server clock; converted to epoch when served
        self.first_token = None
        self.finished = None
        # arrays, not lists: untracked by the garbage collector, whose full passes over a long
        # run's records would otherwise stall the event loop
        self.chunk_times = array("d")
        self.chunk_tokens = array("i")
        self.prompt_tokens = prompt_tokens
        self.output_tokens = 0
        self.cached_tokens = 0
        self.max_tokens = max_tokens
        self.finish_reason = None
        self.fault = None
        self.error = None

    def as_dict(self, epoch_offset: float) -> dict:
        def ep(t):
            return None if t is None else round(t + epoch_offset, 6)
        return {
            "seq": self.seq, "request_id": self.request_id, "x_request_id": self.x_request_id,
            "kind": self.kind,
            "model": self.model, "engine": self.engine, "stream": self.stream,
            "status": self.status, "arrival": ep(self.arrival),
            "first_token": ep(self.first_token), "finished": ep(self.finished),
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens, "max_tokens": self.max_tokens,
            "finish_reason": self.finish_reason, "fault": self.fault, "error": self.error,
            "chunk_times": [round(t + epoch_offset, 6) for t in self.chunk_times],
            "chunk_tokens": self.chunk_tokens.tolist(),
        }


class RequestStream:
    """One request between the engine and its client.

    The driver calls ``deliver`` synchronously for each TokenEvent. A streaming request's frames
    are written straight to the socket as one HTTP chunk per step (``ChunkFormat`` templates, the
    JSON-escaped text of each token precomputed); a non-streaming one collects its token count
    and is answered when it finishes. ``done`` resolves when the handler may return.
    """

    __slots__ = ("record", "text", "fmt", "token_json", "transport", "done", "metrics",
                 "include_usage", "cached_reported", "fault", "fault_at", "stall_s",
                 "stalled_until", "pending", "sent", "last_chunk", "closed", "abort_cb", "loop")

    def __init__(self, record: ServerRecord, text: OutputText, fmt: ChunkFormat | None,
                 token_json: list[bytes], metrics: EngineMetrics, include_usage: bool,
                 cached_reported: bool, loop: asyncio.AbstractEventLoop):
        self.record = record
        self.text = text
        self.fmt = fmt
        self.token_json = token_json
        self.transport = None
        self.loop = loop
        self.done = loop.create_future()
        self.metrics = metrics
        self.include_usage = include_usage
        self.cached_reported = cached_reported
        self.fault = None
        self.fault_at = 0
        self.stall_s = 0.0
        self.stalled_until = 0.0
        self.pending: list[bytes] = []
        self.sent = 0
        self.last_chunk = None
        self.closed = False
        self.abort_cb = None

    def set_fault(self, fault, expected_tokens: int, stall_s: float):
        self.fault = fault.kind
        self.stall_s = stall_s
        self.fault_at = fault.strike_token(expected_tokens)

    # -- called by the driver ----------------------------------------------------------------
    def deliver(self, n_new: int, finished: bool, reason: str | None, now: float) -> None:
        if self.closed:
            return
        rec = self.record
        start = self.sent
        self.sent = end = start + n_new
        m = self.metrics
        m.generation_tokens += n_new
        if rec.first_token is None:
            rec.first_token = now
            m.prompt_tokens += rec.prompt_tokens
            m.ttft.observe(now - rec.arrival)
        else:
            m.itl.observe(now - self.last_chunk)
        self.last_chunk = now
        rec.output_tokens = end
        if self.fmt is None:  # non-streaming: the handler renders the whole text at the end
            rec.chunk_times.append(now)
            rec.chunk_tokens.append(n_new)
            if finished:
                self._finish(reason, now)
            return

        fault = self.fault
        if fault is not None and (start == 0 or end < self.fault_at):
            fault = None  # not yet: never on the first chunk
        if fault is not None:
            self.fault = None
            if self._strike(fault, start, now):
                return
        # a cut connection never gets the usage chunk or [DONE]
        frames = self._content_frames(start, end, finished, reason, tail=fault != "cut")
        rec.chunk_tokens.append(n_new)
        if fault == "cut":
            self._cut(frames, finished, reason, now)
            return
        if self.stalled_until:
            self.pending.append(frames)
            rec.chunk_times.append(self.stalled_until)
            if finished:
                self._finish(reason, now, defer=True)
            return
        rec.chunk_times.append(now)
        self._write(frames, now)
        if finished:
            self._finish(reason, now)

    # The fault's own steps: off the per-chunk path, they run once in a request's life.
    def _strike(self, fault: str, start: int, now: float) -> bool:
        """The drawn fault strikes at this chunk; True when it ended the request."""
        rec = self.record
        rec.fault = fault
        if fault == "error_event":
            rec.output_tokens = start  # this step's tokens never reach the client
            self._write(error_frame("Injected fault: the engine failed mid-stream "
                                    "(servelab sim --faults error_event)") + DONE_FRAME, now)
            self._finish("abort", now, error="error_event")
            self._abort_engine(now)
            return True
        if fault == "stall":
            self.stalled_until = now + self.stall_s
            self.loop.call_later(self.stall_s, self._flush)
        elif fault == "malformed":
            self.pending.append(self.fmt.malformed())
        return False

    def _cut(self, frames: bytes, finished: bool, reason: str | None, now: float) -> None:
        """This chunk's content goes out, then the connection is closed under the client."""
        self.record.chunk_times.append(now)
        self._write(frames, now)
        self._finish("abort" if not finished else reason, now, error="cut")
        if self.transport is not None:
            self.transport.close()
        if not finished:
            self._abort_engine(now)

    def _content_frames(self, start: int, end: int, finished: bool, reason: str | None,
                        tail: bool = True) -> bytes:
        fmt = self.fmt
        tj = self.token_json
        text = b"".join([tj[i] for i in self.text.ids(start, end)])
        out = fmt.content(text, end, reason if finished else None)
        if start == 0 and fmt.kind == "chat":
            out = fmt.role() + out
        if finished and tail:
            if self.include_usage:
                cached = self.record.cached_tokens if self.cached_reported else None
                out += fmt.final_usage(end, cached)
            out += DONE_FRAME
        return out

    def _write(self, frames: bytes, now: float) -> None:
        if self.pending:
            frames = b"".join(self.pending) + frames
            self.pending.clear()
        if not frames:
            return  # an empty HTTP chunk would end the body
        t = self.transport
        if t is None or t.is_closing():
            self._client_gone(now)
            return
        t.write(b"%x\r\n%b\r\n" % (len(frames), frames))
        if t.get_write_buffer_size() > MAX_CLIENT_BUFFER:
            t.abort()
            self._client_gone(now)

    def _flush(self) -> None:
        self.stalled_until = 0.0
        now = clock()
        if self.pending and not self.closed:
            self._write(b"", now)
        if self.record.finish_reason is not None and not self.done.done():
            self.done.set_result(None)

    def _client_gone(self, now: float) -> None:
        if self.closed:
            return
        self._finish("abort", now, error="client disconnected")
        self._abort_engine(now)

    def _abort_engine(self, now: float) -> None:
        if self.abort_cb is not None:
            self.abort_cb(self, now)

    def _finish(self, reason: str, now: float, error: str | None = None,
                defer: bool = False) -> None:
        rec = self.record
        if rec.finish_reason is not None:
            return
        rec.finish_reason = reason
        rec.finished = self.stalled_until or now
        if error:
            rec.error = error
        if error is not None or reason == "abort":
            self.closed = True
        if not defer and not self.done.done():
            self.done.set_result(None)

    def fail(self, message: str, now: float) -> None:
        """The engine died: vLLM's error frame on a stream, an error status otherwise."""
        if self.record.finish_reason is not None:
            return
        if self.fmt is not None:
            self._write(error_frame(message) + DONE_FRAME, now)
        self._finish("abort", now, error="engine dead")

    def cancel(self, now: float) -> None:
        """The client went away before the request finished (handler cancelled)."""
        if self.record.finish_reason is None:
            self._finish("abort", now, error="client disconnected")
            self._abort_engine(now)
