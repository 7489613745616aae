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


# ---- the live server state (the LLM tab) -------------------------------------------------------
def _exposed_names() -> dict[str, list[str]]:
    """Exposed name -> the canonical names (server_metric_names') it stands for, from the server
    kinds' own maps; SGLang's prompt-token counter is also its prefix-cache query count."""
    from servelab.specs.server_kinds import KINDS

    canonical = {"running": "running", "waiting": "waiting", "kv_cache_usage": "kv_usage",
                 "kv_cache_usage_legacy": "kv_usage_legacy", "spec_accept_length":
                 "spec_accept_length"}
    out: dict[str, list[str]] = {}
    for kind in KINDS.values():
        for key, exposed in kind.metrics.items():
            name = canonical.get(key, f"{key}_total" if exposed.endswith("_total") else None)
            if name is not None and name not in out.get(exposed, []):
                out.setdefault(exposed, []).append(name)
    return out


_NAMES = _exposed_names()
_PREFIXES = tuple(_NAMES)
_GAUGES_MEAN = ("kv_usage", "kv_usage_legacy", "spec_accept_length")


def server_state(text: str) -> dict:
    """The canonical gauges and counters of one scrape: running/waiting and counters summed over
    series (engines), KV use averaged (and its max), as server_timeline reads them. A line filter,
    not a full parse: it runs in the master's event loop once a second (a vLLM /metrics page has
    thousands of histogram lines, and parsing them all took milliseconds)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    maxima: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1:].split()
        else:
            name, *rest = line.split()
        metrics = _NAMES.get(name)
        if not metrics or not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value) or math.isinf(value):
            continue
        for m in metrics:
            sums[m] = sums.get(m, 0.0) + value
            counts[m] = counts.get(m, 0) + 1
            maxima[m] = max(maxima.get(m, value), value)
    state = {m: sums[m] / counts[m] if m in _GAUGES_MEAN else sums[m] for m in sums}
    for m in ("kv_usage", "kv_usage_legacy"):
        if m in maxima:
            state[m + "_max"] = maxima[m]
    return state


def server_figures(scrapes: list) -> dict:
    """The server's figures over scrapes [(t, state), ...] (oldest first): the newest gauges, and
    counter increases between the first and the last (a drop is a restarted server: its new
    value counts), as server_stage_summary derives them."""
    if not scrapes:
        return {}
    t1, last = scrapes[-1]
    kv = last.get("kv_usage", last.get("kv_usage_legacy"))
    kv_max = last.get("kv_usage_max", last.get("kv_usage_legacy_max"))
    out = {"running": last.get("running"), "waiting": last.get("waiting"),
           "kv_cache_usage": kv, "kv_cache_usage_max": kv_max,
           "spec_mean_acceptance_length": last.get("spec_accept_length")}
    if len(scrapes) < 2:
        return out
    t0 = scrapes[0][0]

    def increase(name):
        total, prev = None, None
        for _, st in scrapes:
            v = st.get(name)
            if v is None:
                continue
            if prev is not None:
                total = (total or 0.0) + (v if v < prev else v - prev)
            prev = v
        return total

    def share(part, whole):
        return part / whole if part is not None and whole else None

    span = t1 - t0
    pre, gen = increase("preemptions_total"), increase("generation_tokens_total")
    accepted = increase("spec_accepted_tokens_total")
    drafts = increase("spec_drafts_total")
    out.update({
        "preemptions_per_s": pre / span if pre is not None and span > 0 else None,
        "generation_tokens_per_s": gen / span if gen is not None and span > 0 else None,
        "prefix_cache_hit_rate": share(increase("prefix_cache_hits_total"),
                                       increase("prefix_cache_queries_total")),
        "spec_acceptance_rate": share(accepted, increase("spec_draft_tokens_total")),
    })
    if accepted is not None and drafts:
        out["spec_mean_acceptance_length"] = 1 + accepted / drafts
    return out
