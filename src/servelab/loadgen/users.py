"""Locust users. Both stream through FastHttpUser's geventhttpclient session.

- ``LLMUser``: a closed-loop user (``concurrency`` and ``ramp`` plans, and hand-ramped runs in the
  web UI). It takes the worker's next item from the profile (a request, or a whole multi-turn
  session) and sends it, turn after turn, with no wait in between.
- ``OpenLoopUser``: one per worker during ``rate`` and ``trace`` stages. It runs the worker's
  arrival dispatcher; requests are started on schedule in their own greenlets, never by users.
"""
from __future__ import annotations

import logging

import gevent
from locust import FastHttpUser, constant, task
from locust.contrib.fasthttp import FastResponse
from locust.exception import CatchResponseError
from locust.user.users import LOCUST_STATE_STOPPING

from servelab.core.timeouts import REQUEST
from servelab.loadgen.backoff import backoff_s, backs_off
from servelab.loadgen.worker import context as workers

log = logging.getLogger("servelab.loadgen")


class StreamingUser(FastHttpUser):
    """What both users share: no wait, and no socket timeout (timeouts are the watchdog's: a
    socket timeout would arm a timer on every read). The plugin sets ``connection_timeout``
    from ``--timeout-connect``."""
    abstract = True
    wait_time = constant(0)
    network_timeout = None
    connection_timeout = REQUEST.connect

    def on_start(self) -> None:
        workers.prepare_user_client(self.client)


class LLMUser(StreamingUser):
    concurrency = 1   # one stream at a time per closed-loop user
    failures = 0      # fast failures in a row, for the back-off (loadgen/backoff.py)

    @task
    def next_item(self) -> None:
        ctx = workers.current()
        if ctx is None:
            log.warning("servelab: no run context on this worker; is --profile set?")
            gevent.sleep(1.0)
            return
        # The closed loop runs inside the task: between two requests Locust's own round would
        # add a task draw, its wait and a zero sleep through the hub (a greenlet switch, and the
        # rest of the request's work queued behind every other runnable greenlet). A user Locust
        # asks to stop gracefully still stops between requests; a forced stop (servelab's: no
        # stop_timeout) kills it mid-request, which the request records as aborted.
        while self._state != LOCUST_STATE_STOPPING:
            row = ctx.closed_loop_item(self.client)
            if row is None:
                return
            self.failures = self.failures + 1 if backs_off(row.error_kind) else 0
            wait = backoff_s(self.failures)
            if wait:
                gevent.sleep(wait)


class OpenLoopUser(StreamingUser):
    # The dispatcher's requests share this user's connection pool; its size is no cap (the
    # stage's max_in_flight is), so it is set large.
    concurrency = 100_000

    @task
    def dispatch(self) -> None:
        ctx = workers.current()
        if ctx is None:
            gevent.sleep(1.0)
            return
        loop = ctx.next_open_stage()
        if loop is None:
            return
        loop.client = self.client
        loop.run()


def report_request(session, name: str, e2e_ms: float, output_tokens: int, failure: str | None,
                   raw, start_time: float, url: str) -> None:
    """The client's report of one attempt as Locust's request event: name = the profile's
    class, response_time = E2E in ms (not time-to-headers), response_length = output tokens."""
    user = session.user
    session.request_event.fire(
        request_type="POST", name=name, response_time=e2e_ms, response_length=output_tokens,
        exception=CatchResponseError(failure) if failure is not None else None,
        context=user.context() if user is not None else {},
        response=FastResponse(raw) if raw is not None else None, start_time=start_time,
        url=url)
