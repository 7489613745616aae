"""Request timeouts without a timer per chunk.

A socket timeout makes gevent arm and cancel a timer on every ``recv``: measured at 8-14 us per
streamed chunk, more than the rest of the chunk's handling. Instead, one greenlet per process
looks at every in-flight stream ``resolution_s`` times a second and throws ``StreamTimeout`` into
a stream whose first token, next chunk or total time is overdue. It reads the stream's own
record (``StreamState.stamps``), so the hot path does no bookkeeping for it.
"""
from __future__ import annotations

import time

import gevent
from gevent import getcurrent


class StreamTimeout(TimeoutError):
    """Thrown into a request greenlet; ``kind`` is the error_kind to record."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind
        self.text = text


class _Watch:
    __slots__ = ("state", "t_sent", "token")

    def __init__(self, state, t_sent, token):
        self.state = state
        self.t_sent = t_sent
        self.token = token


class Watchdog:
    def __init__(self, timeouts, resolution_s: float = 0.05):
        self.timeouts = timeouts
        self.resolution_s = resolution_s
        self._watches: dict = {}
        self._next_token = 0
        self._greenlet = None

    def watch(self, state, t_sent: float) -> int:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run)
        self._next_token += 1
        self._watches[getcurrent()] = _Watch(state, t_sent, self._next_token)
        return self._next_token

    def release(self) -> None:
        self._watches.pop(getcurrent(), None)

    def in_flight(self) -> int:
        return len(self._watches)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _run(self) -> None:
        to = self.timeouts
        hub_loop = gevent.get_hub().loop
        while True:
            gevent.sleep(self.resolution_s)
            now = time.perf_counter()
            for glet, w in list(self._watches.items()):
                stamps = w.state.stamps
                if now - w.t_sent > to.total_s:
                    exc = StreamTimeout("timeout_total",
                                        f"no complete answer within {to.total_s:g} s")
                elif not stamps:
                    if now - w.t_sent <= to.first_token_s:
                        continue
                    exc = StreamTimeout("timeout_first_token",
                                        f"no output within {to.first_token_s:g} s of sending")
                elif now - stamps[-1] > to.between_chunks_s:
                    exc = StreamTimeout("timeout_between_chunks",
                                        f"no chunk for {to.between_chunks_s:g} s after "
                                        f"{len(stamps)} chunks")
                else:
                    continue
                # Thrown from a loop callback, and only if the greenlet is still on the same
                # request: it is then parked in a socket wait inside that request.
                hub_loop.run_callback(self._throw, glet, w.token, exc)

    def abort_all(self, exc: StreamTimeout) -> int:
        """End every request in flight with ``exc`` (its kind becomes the error_kind)."""
        hub_loop = gevent.get_hub().loop
        watches = list(self._watches.items())
        for glet, w in watches:
            hub_loop.run_callback(self._throw, glet, w.token, exc)
        return len(watches)

    def _throw(self, glet, token, exc) -> None:
        w = self._watches.get(glet)
        if w is not None and w.token == token:
            del self._watches[glet]
            glet.throw(exc)
