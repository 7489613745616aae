"""Scraping the target's Prometheus ``/metrics`` once a second (when it answers).

Fetching happens in the master's event loop, on gevent's own sockets, with a total deadline and
a size cap (``core.bounded_http``): a page that trickles for 10 s or streams 50 MB costs the
deadline or the cap, never the users' loop. Each answer is classified before it goes anywhere:
only a page that is Prometheus or OpenMetrics text goes to the writer, whose database thread
parses it into ``server_metrics`` rows (time, name, labels, value); every other answer is a named
outcome (``OUTCOMES``), an ``endpoint_events`` row through the run's ``EndpointLog``, counted for
the run's notes and the LLM tab. A page the parser refuses (``not_prometheus``) and the quirks a
parse meets (``QUIRKS``) come back from the database thread and are recorded on the next tick.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque

import gevent
import orjson
from prometheus_client.openmetrics.parser import \
    text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from servelab.core import bounded_http, credentials
from servelab.store.rows import MetricSample

log = logging.getLogger("servelab.loadgen")
ENDPOINT = "/metrics"
DEADLINE_S = 2.0            # a whole scrape: connect, head and body
MAX_PAGE_BYTES = bounded_http.MAX_BYTES
# Prometheus text first: what vLLM and SGLang serve, and what server_state reads line by line.
ACCEPT = "text/plain;version=0.0.4;q=1.0, application/openmetrics-text;q=0.5, */*;q=0.1"
TEXT_TYPES = ("text/plain", "")          # "": no Content-Type at all (hand-written exporters)
OPENMETRICS_TYPE = "application/openmetrics-text"
_TRANSPORT = ("unreachable", "connection_reset", "malformed_http", "timeout", "truncated",
              "too_large", "http_<status>", "html_page", "empty", "wrong_content_type")
# Every outcome a scrape can have: what it means, as the run's notes say it.
OUTCOMES = {
    "ok": "answered Prometheus text, stored",
    **{k: bounded_http.OUTCOMES[k] for k in _TRANSPORT},
    "absent": "answered 404 (no /metrics: scraping stopped)",
    "json_body": "answered JSON, not Prometheus text",
    "not_prometheus": "answered text the Prometheus parser refuses",
    # notes-only: the page parsed and was stored, with this said about it
    "nan_inf_nulled": "had NaN or infinite values, stored as NULL",
    "duplicate_series": "repeated a series (name and labels), the first one kept",
    "openmetrics_ok": "answered OpenMetrics text, parsed as such",
}
QUIRKS = ("nan_inf_nulled", "duplicate_series", "openmetrics_ok")


class Page(str):
    """A page on its way to the writer: the text, whether it is OpenMetrics, and ``report``,
    which the parse in the database thread calls with the page's quirks (the writer hands the
    object through untouched)."""
    openmetrics = None   # None: the text says (its last line is "# EOF")
    report = None


def classify(answer: bounded_http.Answer) -> tuple[str, str, str | None]:
    """(outcome, what was seen, the page's text when it is one to parse)."""
    if not answer.ok:
        if answer.status == 404:
            return "absent", answer.seen(), None
        return answer.outcome, answer.seen(), None
    body = answer.body
    if not body.strip():
        return "empty", answer.seen(), None
    kind = bounded_http.sniff(body)
    if kind is not None:
        return ("html_page" if kind == "html" else "json_body"), \
            f"{answer.seen()}: {bounded_http.excerpt(body)}", None
    if answer.content_type not in TEXT_TYPES + (OPENMETRICS_TYPE,):
        return "wrong_content_type", f"{answer.seen()}: {bounded_http.excerpt(body)}", None
    try:
        return "ok", "", body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "not_prometheus", f"{answer.seen()}: not UTF-8 text ({exc})", None


class Scraper:
    """``sink(t_unix, page)`` gets each page to store; ``events`` (an ``EndpointLog``, or None)
    gets every outcome. ``parse_failed`` is the writer's ``on_scrape_error``."""

    def __init__(self, base_url: str, sink, interval_s: float = 1.0,
                 deadline_s: float = DEADLINE_S, events=None, max_bytes: int = MAX_PAGE_BYTES):
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + ENDPOINT
        self.sink = sink
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self.events = events
        self.samples = 0            # pages handed to the writer
        self.status = "starting"    # starting | ok | one of OUTCOMES (the newest scrape's)
        self.last_t: float | None = None
        # (kind, t_unix, what) from the database thread; a deque's append and popleft are
        # atomic, so that thread never touches the event loop's objects
        self._inbox: deque = deque()
        self._greenlet = gevent.spawn(self._loop)

    def scrape_once(self) -> bool:
        """One scrape; False when the target has no /metrics (stop asking)."""
        self.flush()
        t = time.time()
        headers = {"Accept": ACCEPT, **credentials.headers()}
        answer = bounded_http.fetch(self.base_url, ENDPOINT, headers=headers,
                                    deadline_s=self.deadline_s, max_bytes=self.max_bytes,
                                    cooperative=True)
        outcome, detail, text = classify(answer)
        self.last_t = t
        self.status = outcome
        if text is None:
            if outcome == "absent":
                log.info("servelab: %s answers 404; no server metrics for this run", self.url)
            elif self.events is None or not self.events.seen(ENDPOINT, outcome):
                log.warning("servelab: %s %s (%s): %s; no server metrics from it, the run goes "
                            "on", self.url, OUTCOMES.get(outcome, bounded_http.describe(outcome)),
                            outcome, detail)
            if self.events is not None:
                self.events.record(ENDPOINT, outcome, detail, t)
            return outcome != "absent"
        page = Page(text)
        page.openmetrics = answer.content_type == OPENMETRICS_TYPE or _ends_with_eof(text)
        page.report = self._quirks
        self.samples += 1
        if self.events is not None:
            self.events.ok(ENDPOINT, t)
        self.sink(t, page)
        return True

    # ---- from the database thread ---------------------------------------------------------
    def parse_failed(self, t_unix: float, exc: BaseException) -> None:
        self._inbox.append(("not_prometheus", t_unix, f"{type(exc).__name__}: {exc}"[:300]))

    def _quirks(self, t_unix: float, quirks: dict) -> None:
        self._inbox.append(("quirks", t_unix, quirks))

    def flush(self) -> None:
        """Record what the database thread reported (the event loop's side of the inbox)."""
        while self._inbox:
            kind, t, what = self._inbox.popleft()
            if kind == "quirks":
                for name, n in what.items():
                    if n and self.events is not None:
                        self.events.quirk(ENDPOINT, name, n, t)
                continue
            if t == self.last_t:
                self.status = kind
            if self.events is not None:
                self.events.record(ENDPOINT, kind, what, t, was_ok=True)

    def _loop(self) -> None:
        next_t = time.monotonic()
        while True:
            if not self.scrape_once():
                self.flush()
                return  # no /metrics: stop asking
            now = time.monotonic()
            next_t += self.interval_s
            if next_t < now:   # a slow scrape: the ticks it covered are skipped, not caught up
                next_t += math.ceil((now - next_t) / self.interval_s) * self.interval_s
            gevent.sleep(next_t - now)

    def stop(self) -> None:
        self._greenlet.kill(block=False)


def _ends_with_eof(text: str) -> bool:
    return text[-64:].rstrip().endswith("# EOF")


def metric_rows(run_id: str, t_unix: float, text: str) -> bytes:
    """NDJSON server_metrics rows for one scrape: OpenMetrics text with OpenMetrics' parser, NaN
    and infinities as NULL, a repeated series once (its first sample). A ``Page``'s quirks go
    back through its ``report``; a page the parser refuses raises (the writer counts it)."""
    om = getattr(text, "openmetrics", None)
    if om is None:
        om = _ends_with_eof(text)
    out, seen = [], set()
    nan = dup = 0
    for family in (openmetrics_families if om else text_string_to_metric_families)(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen:
                dup += 1
                continue
            seen.add(key)
            value = s.value
            if value is not None and (math.isnan(value) or math.isinf(value)):
                value = None
                nan += 1
            out.append(orjson.dumps(MetricSample(run_id, t_unix, s.name, s.labels, value)))
    report = getattr(text, "report", None)
    if report is not None and (nan or dup or om):
        report(t_unix, {"nan_inf_nulled": nan, "duplicate_series": dup,
                        "openmetrics_ok": int(bool(om))})
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
MAX_LINE = 4096


def _sample(line: str) -> tuple[str, str, str] | None:
    """(name, series key, value text) of a sample line, or None. Label values may hold braces
    and '#' inside their quotes, and an OpenMetrics exemplar may follow the value."""
    brace = line.find("{")
    space = line.find(" ")
    if brace < 0 or (0 <= space < brace):
        name, _, rest = line.partition(" ")
        key = name
    else:
        name, i, quoted = line[:brace], brace + 1, False
        while i < len(line) and (quoted or line[i] != "}"):
            if line[i] == "\\" and quoted:
                i += 1
            elif line[i] == '"':
                quoted = not quoted
            i += 1
        key, rest = line[:i + 1], line[i + 1:]
    value = rest.split(None, 1)
    return (name, key, value[0]) if value else None


def server_state(text: str) -> dict:
    """The canonical gauges and counters of one scrape: running/waiting and counters summed over
    series (engines), KV use averaged (and its max), as server_timeline reads them. A line filter,
    not a full parse: it runs in the master's event loop once a second (a vLLM /metrics page has
    thousands of histogram lines, and parsing them all took milliseconds). A repeated series
    counts once (its first sample, as metric_rows stores it); NaN and infinities are skipped."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    maxima: dict[str, float] = {}
    seen: set[str] = set()
    for line in text.splitlines():
        # a gauge's line is short: one of megabytes (a hostile label) would hold the loop
        if not line.startswith(_PREFIXES) or len(line) > MAX_LINE:
            continue
        got = _sample(line)
        metrics = _NAMES.get(got[0]) if got else None
        if not metrics or got[1] in seen:
            continue
        seen.add(got[1])
        try:
            value = float(got[2])
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
