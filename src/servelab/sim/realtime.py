"""Drives the clock-free engines in real time and delivers each step's tokens to the clients.

One asyncio task per engine::

    loop: if no work, wait for a request
          out = engine.step(start)              # the step's simulated duration
          sleep until start + out.duration_s    # an absolute deadline, not "duration from now"
          deliver out.events                    # one chunk per request per step
          start = that deadline                 # the schedule stays anchored

Timers: epoll and libuv wake up with millisecond granularity, so the driver sleeps until
``guard_s`` before the deadline and then yields (``sleep(0)``) until the deadline passes. That costs
a little CPU between steps and keeps the delivery error well under a millisecond.

Lag = actual delivery time - scheduled step end. It is exported per engine (``metrics.py``). Small
lags are caught up (the next step starts at the scheduled time, not the late wake-up, so lag does
not accumulate silently); a lag beyond ``resync_after_s`` re-anchors the schedule at the wake-up
and counts a resync, since an overloaded process cannot catch up and the run should be flagged.
"""
from __future__ import annotations

import asyncio
import time
import traceback
from array import array

from servelab.sim.balancer import least_outstanding
from servelab.sim.metrics import EngineMetrics
from servelab.sim.protocol import DONE_FRAME, ChunkFormat, error_frame
from servelab.sim.textgen import OutputText

# A client that stops reading gets aborted once this much is queued for it.
MAX_CLIENT_BUFFER = 8 << 20
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
clock = time.perf_counter


class RequestRecord:
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

    def __init__(self, record: RequestRecord, text: OutputText, fmt: ChunkFormat | None,
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

    def set_fault(self, kind: str, at_fraction: float, expected_tokens: int, stall_s: float):
        self.fault = kind
        self.stall_s = stall_s
        # Strike at the first chunk after the first whose tokens reach this count.
        self.fault_at = 1 + int(at_fraction * max(expected_tokens - 1, 0))

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
            rec.fault = fault
            if fault == "error_event":
                rec.output_tokens = start  # this step's tokens never reach the client
                self._write(error_frame("Injected fault: the engine failed mid-stream "
                                        "(servelab sim --faults error_event)") + DONE_FRAME, now)
                self._finish("abort", now, error="error_event")
                self._abort_engine(now)
                return
            if fault == "stall":
                self.stalled_until = now + self.stall_s
                self.loop.call_later(self.stall_s, self._flush)
            elif fault == "malformed":
                self.pending.append(self.fmt.malformed())
        # a cut connection never gets the usage chunk or [DONE]
        frames = self._content_frames(start, end, finished, reason, tail=fault != "cut")
        rec.chunk_tokens.append(n_new)
        if fault == "cut":
            rec.chunk_times.append(now)
            self._write(frames, now)
            self._finish("abort" if not finished else reason, now, error="cut")
            if self.transport is not None:
                self.transport.close()
            if not finished:
                self._abort_engine(now)
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


class EngineDriver:
    """Runs one engine in real time and routes its TokenEvents to the request streams."""

    def __init__(self, engine, metrics: EngineMetrics, on_finished, guard_s: float = 0.001,
                 resync_after_s: float = 0.05):
        self.engine = engine
        self.index = engine.engine_index
        self.metrics = metrics
        self.on_finished = on_finished   # callback(driver, stream, seq or None)
        self.guard_s = guard_s
        self.resync_after_s = resync_after_s
        self.streams: dict[str, RequestStream] = {}
        self.dead: BaseException | None = None
        self._wake = asyncio.Event()
        self._task = None

    @property
    def outstanding(self) -> int:
        return len(self.streams)

    def submit(self, stream: RequestStream, prompt_ids, max_tokens: int, min_tokens: int,
               ignore_eos: bool, eos_after: int | None, spec_acceptance: float | None) -> None:
        rec = stream.record
        rec.engine = self.index
        self.engine.add_request(rec.engine_id, prompt_ids, max_tokens, min_tokens=min_tokens,
                                ignore_eos=ignore_eos, eos_after=eos_after,
                                arrival_time=rec.arrival, spec_acceptance=spec_acceptance)
        stream.abort_cb = self._abort
        self.streams[rec.engine_id] = stream
        self._wake.set()

    def _abort(self, stream: RequestStream, now: float) -> None:
        rid = stream.record.engine_id
        if self.streams.pop(rid, None) is not None:
            seq = self.engine.get_sequence(rid)
            if seq is not None:
                stream.record.cached_tokens = max(seq.num_cached_tokens, 0)
            self.engine.abort_request(rid, now)
            self.on_finished(self, stream, seq)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"engine-{self.index}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def run(self) -> None:
        try:
            await self._run()
        except Exception as exc:  # an engine bug: fail its requests as a dead vLLM engine would
            self.dead = exc
            traceback.print_exc()
            now = clock()
            for stream in list(self.streams.values()):
                stream.fail(ENGINE_DEAD_MESSAGE, now)
                self.on_finished(self, stream, None)
            self.streams.clear()

    async def _run(self) -> None:
        engine, m = self.engine, self.metrics
        guard, resync_after = self.guard_s, self.resync_after_s
        sleep = asyncio.sleep
        start = clock()
        while True:
            if not engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                start = clock()  # idle: a fresh schedule begins with the request
            out = engine.step(start)
            end = start + out.duration_s
            delay = end - clock()
            if delay > guard:
                await sleep(delay - guard)
            while clock() < end:
                await sleep(0)
            woke = clock()
            lag = woke - end
            m.lag.observe(lag)
            m.lag_last = lag
            if lag > m.lag_max:
                m.lag_max = lag
            m.steps += 1
            if out.num_scheduled_tokens:
                m.iteration_tokens.observe(out.num_scheduled_tokens)
            self._deliver(out, woke)
            m.delivery.observe(clock() - woke)
            if lag > resync_after:
                m.resyncs += 1
                start = woke
            else:
                start = end

    def _deliver(self, out, now: float) -> None:
        streams = self.streams
        finished = {}
        if out.finished:
            finished = {seq.request_id: seq for seq in out.finished}
        for ev in out.events:
            stream = streams.get(ev.request_id)
            if stream is None:
                continue
            if ev.finished:
                del streams[ev.request_id]
                seq = finished.get(ev.request_id)
                if seq is not None:
                    stream.record.cached_tokens = max(seq.num_cached_tokens, 0)
                stream.deliver(ev.new_tokens, True, ev.finish_reason, now)
                self.on_finished(self, stream, seq)
            else:
                stream.deliver(ev.new_tokens, False, None, now)
                if stream.closed and ev.request_id in streams:
                    # a fault or a vanished client closed it during delivery
                    self._abort(stream, now)


def pick_driver(drivers: list[EngineDriver]) -> EngineDriver | None:
    """Least outstanding requests, the server's own balancing for DP ranks and instances;
    None when every engine is dead."""
    if len(drivers) == 1:
        return None if drivers[0].dead else drivers[0]
    alive = [d for d in drivers if d.dead is None]
    if not alive:
        return None
    return alive[least_outstanding([d.outstanding for d in alive])]
