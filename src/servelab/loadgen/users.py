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

from servelab.loadgen import worker as workers

log = logging.getLogger("servelab.loadgen")


class LLMUser(FastHttpUser):
    wait_time = constant(0)
    # One stream at a time per closed-loop user; timeouts are the watchdog's (a socket timeout
    # would arm a timer on every read).
    concurrency = 1
    network_timeout = None
    connection_timeout = 10.0

    def on_start(self) -> None:
        workers.prepare_user_client(self.client)

    @task
    def next_item(self) -> None:
        ctx = workers.current()
        if ctx is None:
            log.warning("servelab: no run context on this worker; is --profile set?")
            gevent.sleep(1.0)
            return
        ctx.closed_loop_item(self.client)


class OpenLoopUser(FastHttpUser):
    wait_time = constant(0)
    # The dispatcher's requests share this user's connection pool; its size is no cap (the
    # stage's max_in_flight is), so it is set large.
    concurrency = 100_000
    network_timeout = None
    connection_timeout = 10.0

    def on_start(self) -> None:
        workers.prepare_user_client(self.client)

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
