"""Scraping the target's Prometheus ``/metrics`` once a second (when it answers).

Fetching happens in the master's event loop (a cooperative socket); parsing happens in the
database thread, where ``prometheus_client``'s text parser turns each sample into a
``server_metrics`` row (time, name, labels, value).
"""
from __future__ import annotations

import logging
import math
import time
import urllib.error
import urllib.request

import gevent
import orjson
from prometheus_client.parser import text_string_to_metric_families

from servelab.core import credentials
from servelab.store.rows import MetricSample

log = logging.getLogger("servelab.loadgen")


class Scraper:
    def __init__(self, base_url: str, sink, interval_s: float = 1.0, timeout_s: float = 2.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.sink = sink            # called with (t_unix, text)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.samples = 0
        self.status = "starting"    # starting | ok | absent (404) | unreachable
        self._greenlet = gevent.spawn(self._loop)

    def scrape_once(self) -> bool:
        t = time.time()
        try:
            req = urllib.request.Request(self.url, headers=credentials.headers())
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                text = resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                if self.status != "absent":
                    log.info("servelab: %s answers 404; no server metrics for this run", self.url)
                self.status = "absent"
                return False
            self.status = f"http_{exc.code}"
            return True
        except (OSError, ValueError):
            self.status = "unreachable"
            return True
        self.status = "ok"
        self.samples += 1
        self.sink(t, text)
        return True

    def _loop(self) -> None:
        next_t = time.monotonic()
        while True:
            if not self.scrape_once():
                return  # no /metrics: stop asking
            next_t += self.interval_s
            gevent.sleep(max(0.0, next_t - time.monotonic()))

    def stop(self) -> None:
        self._greenlet.kill(block=False)


def metric_rows(run_id: str, t_unix: float, text: str) -> bytes:
    """NDJSON server_metrics rows for one scrape (NaN and infinities become NULL)."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            value = s.value
            if value is not None and (math.isnan(value) or math.isinf(value)):
                value = None
            out.append(orjson.dumps(MetricSample(run_id, t_unix, s.name, s.labels, value)))
    return b"\n".join(out) + b"\n" if out else b""
