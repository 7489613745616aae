"""Verify a prefill/decode-disaggregated variant: every instance is a vLLM server of its own.

Each role's instance is judged by the same rules as any server (model, precision, speculative,
parallelism, KV-cache size, from its own log and ``/metrics``) and, beside them, on what makes it
a PD instance: the KV connector vLLM built (``Creating v1 connector with name: NixlConnector``
and NIXL's worker and scheduler start-up lines), the ``kv_role`` the API server echoes from
``--kv-transfer-config``, and, on a ``/metrics`` page saved after load, NIXL's transfer counters
(the decode instance reads the prefill instance's blocks, so its page counts the transfers; the
prefill instance counts requests whose KV expired before anyone read it). The proxy has no
``/metrics`` and logs nothing servelab reads.

The evidence: one ``docker compose logs`` file of the instances (every line prefixed by its
service, e.g. ``vllm-pd-1p1d-prefill-0``) or one log per instance, prefill instances first; and
one ``/metrics`` page or URL per instance in the same order. The command line's single
``--log`` / ``--metrics`` / ``--url`` takes several joined by commas.
"""
from __future__ import annotations

from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.orchestration.gpus import Gpu
from servelab.orchestration.serverlog import (
    ServerFacts, fetch_metrics, parse_log, parse_metrics, read_log, split_compose_log)
from servelab.orchestration.verify_rules import FAIL, OK, UNKNOWN, WARN, Check, Verdict, judge
from servelab.specs.pd import ConnectorFacts, read_connector_log, read_connector_metrics
from servelab.specs.variants import Variant

STARTED = "Application startup complete"
_GATING = ("precision", "speculative", "kv_connector")   # UNKNOWN in these: unverified


def _paths(value) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [Path(v) for v in value]
    text = str(value)
    if "," in text and not Path(text).exists():
        return [Path(p.strip()) for p in text.split(",") if p.strip()]
    return [Path(text)]


def _logs(variant: Variant, value, services: list[str]) -> tuple[list[str | None], list[str]]:
    paths = _paths(value)
    if not paths:
        return [None] * len(services), []
    if len(paths) == 1:
        text = read_log(paths[0], variant)
        split = split_compose_log(text, services)
        if not split:
            raise ServelabError(
                f"{paths[0]}: no line is prefixed with a {variant.name} service "
                f"({', '.join(services)}); save every instance's log at once with `docker compose "
                f"--profile {variant.name} logs --no-color {' '.join(services)} > {paths[0]}`, "
                f"or give one log per instance, in that order, joined by commas")
        return [split.get(s) for s in services], [str(paths[0])]
    _count(variant, "logs", paths, services)
    return [read_log(p, variant) for p in paths], [str(p) for p in paths]


def _count(variant: Variant, what: str, given: list, services: list[str]) -> None:
    if len(given) != len(services):
        raise ServelabError(f"{variant.name} has {len(services)} instances ({', '.join(services)}):"
                            f" give one {what} per instance in that order, got {len(given)}")


def _pages(variant: Variant, metrics_path, url, services) -> tuple[list[str | None], list[str]]:
    paths = _paths(metrics_path)
    if paths:
        _count(variant, "/metrics page", paths, services)
        for p in paths:
            if not p.is_file():
                raise ServelabError(f"{p}: no such /metrics page; save it from inside the "
                                    f"instance's container (its port is not published)")
        return [p.read_text(encoding="utf-8") for p in paths], [str(p) for p in paths]
    urls = [u.strip() for u in (url or "").split(",") if u.strip()]
    if len(urls) < 2:   # none, or the proxy's (`servelab run --target`): it has no /metrics
        return [None] * len(services), []
    _count(variant, "URL", urls, services)
    pages = [fetch_metrics(u) for u in urls]
    return pages, [u.rstrip("/") + "/metrics" for u, p in zip(urls, pages) if p is not None]


def _connector(variant: Variant, c: ConnectorFacts, log: str | None) -> Check:
    want = variant.pd.kv_connector
    if c.nixl_unavailable:
        return Check("kv_connector", FAIL, "NIXL is not available: the image lacks the nixl "
                     "package, so no KV cache can move between the roles")
    other = [name for name in c.created if name != want]
    if other or c.kv_connector not in (None, want):
        return Check("kv_connector", FAIL, f"the server built {(other or [c.kv_connector])[0]}, "
                     f"the variant says {want}")
    if c.kv_role not in (None, "kv_both"):
        return Check("kv_connector", FAIL, f"kv_role {c.kv_role}; the variant starts both roles "
                     f"with kv_both (the proxy picks each request's sender)")
    if want in c.created:
        nixl = f"; NIXL {', '.join(c.nixl_init)} initialized" if c.nixl_init else ""
        role = f", kv_role {c.kv_role}" if c.kv_role else ""
        return Check("kv_connector", OK, f"{want}{role} (engine_id {c.engine_ids[0]}){nixl}")
    if c.kv_connector == want:
        return Check("kv_connector", OK, f"{want}, kv_role {c.kv_role} (from the --kv-transfer-"
                     f"config echo; no 'Creating v1 connector' line in this log)")
    if c.nixl_metrics:
        return Check("kv_connector", OK, "vllm:nixl_* metrics present: NIXL is registered")
    if log is not None and STARTED in log:
        return Check("kv_connector", FAIL, "the log reached start-up without creating a KV "
                     "connector: this instance runs without --kv-transfer-config, so it serves "
                     "requests colocated")
    return Check("kv_connector", UNKNOWN, "no 'Creating v1 connector' line in the log (cut "
                 "short?) and no vllm:nixl_* metrics")


def _transfers(role: str, c: ConnectorFacts, page: str | None) -> Check | None:
    if page is None:
        return None
    if not c.nixl_metrics:
        return Check("kv_transfer", UNKNOWN, "no vllm:nixl_* metrics on this /metrics page")
    if c.failed_transfers:
        return Check("kv_transfer", WARN, f"{c.failed_transfers:.0f} NIXL transfers failed "
                     f"(vllm:nixl_num_failed_transfers_total)")
    if role == "prefill":
        if c.expired_reqs:
            return Check("kv_transfer", WARN, f"{c.expired_reqs:.0f} requests' KV expired here "
                         f"before a decode instance read it (VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
        return Check("kv_transfer", OK, "no expired or failed transfers (the decode instance "
                     "counts the reads)")
    if not c.transfers:
        return Check("kv_transfer", WARN, "0 KV transfers read so far: was the page saved before "
                     "any request went through the proxy?")
    mib = (c.transfer_bytes or 0) / 2**20
    mean = (c.transfer_s or 0) / c.transfers * 1000
    return Check("kv_transfer", OK, f"{c.transfers:.0f} KV transfers read, {mib:,.1f} MiB, "
                 f"mean {mean:.2f} ms")


def verify_pd(variant: Variant, log_path=None, url=None, metrics_path=None,
              gpus: list[Gpu] | None = None, expected_kv_tokens: int | None = None) -> Verdict:
    from servelab.orchestration.compose import service_name

    pd = variant.pd
    services = [service_name(variant, i) for i in range(variant.instances)]
    logs, sources = _logs(variant, log_path, services)
    pages, more = _pages(variant, metrics_path, url, services)
    checks, roles, statuses = [], {}, []
    if url and "," not in url:
        checks.append(Check("evidence", UNKNOWN, f"{url} is one URL for {len(services)} "
                            f"instances (the proxy has no /metrics): give each instance's URL, "
                            f"joined by commas"))
    for i, service in enumerate(services):
        role = pd.role(i)
        name = f"{role}-{pd.index_in_role(i)}"
        facts, conn = ServerFacts(), ConnectorFacts()
        if logs[i] is not None:
            parse_log(logs[i], facts, variant.server)
            read_connector_log(logs[i], conn)
        if pages[i] is not None:
            parse_metrics(pages[i], facts, variant.server)
            read_connector_metrics(pages[i], conn)
        part = judge(variant, facts, gpus, expected_kv_tokens)
        own = part.checks + [_connector(variant, conn, logs[i])]
        if (moved := _transfers(role, conn, pages[i])) is not None:
            own.append(moved)
        if logs[i] is None and pages[i] is None:
            own.insert(0, Check("evidence", UNKNOWN, f"no log lines or /metrics of {service}"))
        checks += [Check(f"{name} {c.name}", c.status, c.detail) for c in own]
        statuses.append(part.status)
        roles[name] = {"service": service, "status": part.status, "connector": conn.to_record(),
                       **part.facts}
    if "failed_to_start" in statuses:
        status = "failed_to_start"
    elif any(c.status == FAIL for c in checks):
        status = "mismatch"
    elif "unverified" in statuses or any(
            c.status == UNKNOWN and c.name.split(" ")[-1] in _GATING + ("evidence",)
            for c in checks):
        status = "unverified"
    else:
        status = "verified"
    return Verdict(variant.name, status, checks, {"pd": pd.to_record(), "roles": roles},
                   sources + more)
