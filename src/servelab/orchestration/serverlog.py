"""What a server really runs, read from its start-up log and its Prometheus ``/metrics``.

The grammar belongs to the server's kind (``specs.server_kinds``: vLLM's kernel lines, engine
config and metric names live in ``server_kinds/vllm/log.py``); this is where orchestration and the
tests ask for it, naming the kind (``vllm`` unless told). ``split_compose_log`` takes apart what
``docker compose logs`` writes for several services at once, so one saved file can hold every
instance of a variant (a PD variant's prefill and decode roles).
"""
from __future__ import annotations

import re
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.core.timeouts import HTTP_PROBE_S
from servelab.specs.server_kinds import DEFAULT_KIND, ServerFacts, server_kind

__all__ = ["ServerFacts", "fetch_metrics", "metrics_missing", "parse_log", "parse_metrics",
           "read_log", "read_metrics", "split_compose_log"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# `docker compose logs` prefixes each line with the container's name padded to a common width
# and " | ": "web-1  | ...", or "project-web-1  | ..." (older Compose v2), or "web  | ...".
_PREFIXED = re.compile(r"^([A-Za-z0-9][\w.-]*)\s+\| ?(.*)$")


def parse_log(text: str, facts: ServerFacts | None = None,
              server: str = DEFAULT_KIND) -> ServerFacts:
    return server_kind(server).parse_log(text, facts)


def parse_metrics(text: str, facts: ServerFacts | None = None,
                  server: str = DEFAULT_KIND) -> ServerFacts:
    """Read what ``/metrics`` confirms: cache config, engines, speculative counters."""
    return server_kind(server).parse_metrics(text, facts)


def _service_of(prefix: str, services: list[str]) -> str | None:
    for service in services:
        if re.fullmatch(rf"(?:[\w.-]+[-_])?{re.escape(service)}(?:[-_]\d+)?", prefix):
            return service
        # the simulator's PD log names a role only ("prefill-0 | ..."): the service ending so
        if service.endswith("-" + prefix):
            return service
    return None


def split_compose_log(text: str, services: list[str]) -> dict[str, str]:
    """Each named service's lines, prefix removed, from a ``docker compose logs`` file; a
    service with no line is absent, and lines of other services (or none) are dropped."""
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        m = _PREFIXED.match(_ANSI.sub("", raw))
        if m is None:
            continue
        service = _service_of(m.group(1), services)
        if service is not None:
            out.setdefault(service, []).append(m.group(2))
    return {s: "\n".join(lines) + "\n" for s, lines in out.items()}


def read_log(path: Path, variant) -> str:
    """A saved server log; a missing file names the command that saves one."""
    if not path.is_file():
        from servelab.orchestration.compose import service_name

        raise ServelabError(f"{path}: no such log file; save the server's output (e.g. "
                            f"`docker compose logs --no-color {service_name(variant)} > {path}`)")
    return path.read_text(encoding="utf-8", errors="replace")


def read_metrics(url: str, timeout: float = HTTP_PROBE_S) -> tuple[str | None, str, str]:
    """(the ``/metrics`` page or None, its outcome, what came back): the scraper's own
    classification (``loadgen.master.scraper.OUTCOMES``), and a page only when the Prometheus
    (or OpenMetrics) parser takes it, so a caller never meets a login page or a parse error."""
    from servelab.core import bounded_http, credentials
    from servelab.loadgen.master.scraper import ACCEPT, Page, classify, metric_rows

    try:
        answer = bounded_http.fetch(url, "/metrics", deadline_s=timeout,
                                    headers={"Accept": ACCEPT, **credentials.headers()})
    except ValueError as exc:
        return None, "unreachable", str(exc)
    outcome, detail, text = classify(answer)
    if text is None:
        return None, outcome, detail
    page = Page(text)
    page.openmetrics = answer.content_type == "application/openmetrics-text"
    try:
        metric_rows("probe", 0.0, page)
    except ValueError as exc:
        return None, "not_prometheus", f"{answer.seen()}: {exc}"
    return text, "ok", ""


def fetch_metrics(url: str, timeout: float = HTTP_PROBE_S) -> str | None:
    """``/metrics`` of a server, or None when it has none (404), cannot be reached or answers
    something that is not Prometheus text (``read_metrics`` says which)."""
    return read_metrics(url, timeout)[0]


def metrics_missing(url: str, outcome: str, detail: str) -> str:
    """Why a server's /metrics gave no evidence, for a verdict or a preflight."""
    from servelab.loadgen.master.scraper import OUTCOMES

    return (f"{url.rstrip('/')}/metrics {OUTCOMES.get(outcome, outcome)} ({outcome}: "
            f"{detail})")
