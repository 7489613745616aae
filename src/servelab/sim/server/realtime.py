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
import traceback

from servelab.sim.engine.balancer import least_outstanding
from servelab.sim.engine.frontend import APIServer
from servelab.sim.server.metrics import EngineMetrics
from servelab.sim.server.stream import RequestStream, clock

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


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
        self.iteration_log = None   # sim.server.iteration_log.IterationLog, when details are on
        # The API server's CPU as the calibration prices it (the same stage predict runs).
        self.api = APIServer(engine.cost.params)

    @property
    def outstanding(self) -> int:
        return len(self.streams)

    def submit(self, stream: RequestStream, prompt_ids, max_tokens: int, min_tokens: int,
               ignore_eos: bool, eos_after: int | None, spec_acceptance: float | None) -> None:
        rec = stream.record
        rec.engine = self.index
        stream.abort_cb = self._abort
        self.streams[rec.engine_id] = stream

        def add(arrival: float) -> None:
            if rec.engine_id in self.streams:   # not aborted while in the API server's queue
                self.engine.add_request(rec.engine_id, prompt_ids, max_tokens,
                                        min_tokens=min_tokens, ignore_eos=ignore_eos,
                                        eos_after=eos_after, arrival_time=arrival,
                                        spec_acceptance=spec_acceptance)
                self._wake.set()
        wait = self.api.request_in(clock(), len(prompt_ids)) - clock() if self.api.enabled else 0
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, lambda: add(clock()))
        else:
            add(rec.arrival)

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
                self.api.reset_gate()
            gate = self.api.gate()
            if gate > clock():   # the API server has not streamed the step before last yet
                await sleep(gate - clock())
                start = max(start, gate)
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
            if out.shape.num_tokens:
                m.iteration_tokens.observe(out.shape.num_tokens)
            if self.iteration_log is not None:   # logged at the step's end, as vLLM does
                self.iteration_log.record(self.index, out, engine.block_manager.usage)
            if self.api.enabled:   # the chunks leave once the API server has processed them
                at = self.api.step_out(woke, len(out.events)) - clock()
                asyncio.get_running_loop().call_later(max(0.0, at),
                                                      lambda o=out: self._deliver(o, clock()))
            else:
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
