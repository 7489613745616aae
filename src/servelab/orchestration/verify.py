"""Hold a started server to its variant's claims, from its log and ``/metrics``.

The central check is precision: vLLM accepts ``--quantization fp8`` on a GPU without FP8 tensor
cores and silently serves weight-only FP8 through Marlin (W8A16). The rules are the same for every
server kind; reading the evidence (log grammar, kernel names) is the kind's job
(``specs.server_kinds``). A run is ``verified`` when the
evidence shows the claimed path, ``mismatch`` when it shows another one, and ``unverified`` when
the evidence is missing; every comparison that includes such a run says so (``runs.flags``).
A prefill/decode-disaggregated variant is judged instance by instance (``verify_pd``).
"""
from __future__ import annotations

from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.orchestration.gpus import Gpu
from servelab.orchestration.serverlog import (  # noqa: F401  (fetch_metrics: callers import it here)
    ServerFacts, fetch_metrics, metrics_missing, parse_log, parse_metrics, read_log,
    read_metrics)
from servelab.orchestration.verify_pd import verify_pd
from servelab.orchestration.verify_rules import (  # noqa: F401  (the names callers import here)
    FLAG_MISMATCH, FLAG_UNVERIFIED, UNKNOWN, Check, Verdict, judge)
from servelab.specs.variants import Variant


def verify(variant: Variant, log_path: str | Path | None = None, url: str | None = None,
           metrics_path: str | Path | None = None, gpus: list[Gpu] | None = None,
           expected_kv_tokens: int | None = None) -> Verdict:
    if variant.pd is not None:
        return verify_pd(variant, log_path, url, metrics_path, gpus, expected_kv_tokens)
    facts, sources = ServerFacts(), []
    if log_path is not None:
        path = Path(log_path)
        parse_log(read_log(path, variant), facts, variant.server)
        sources.append(str(path))
    metrics, missing = None, None
    if metrics_path is not None:
        metrics = Path(metrics_path).read_text(encoding="utf-8")
        sources.append(str(metrics_path))
    elif url is not None:
        metrics, outcome, detail = read_metrics(url)
        if metrics is not None:
            sources.append(url.rstrip("/") + "/metrics")
        else:
            missing = metrics_missing(url, outcome, detail)
    families = None
    if metrics is not None:
        parse_metrics(metrics, facts, variant.server)
        families = metric_families(metrics)
    if url is not None and facts.vllm_version is None and variant.server == "vllm":
        facts.vllm_version = read_version(url)
    verdict = judge(variant, facts, gpus, expected_kv_tokens, sources, families)
    if missing is not None:   # what the server answered instead, named
        verdict.checks.insert(0, Check("metrics", UNKNOWN, f"{missing}; judged without it"))
    return verdict


def metric_families(text: str) -> set[str]:
    """The family names a /metrics page exposes (read_metrics hands over parsable pages only)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name for family in text_string_to_metric_families(text)}


def read_version(url: str) -> str | None:
    """What ``GET /version`` says (vLLM: ``{"version": "0.26.0"}``), or None when it says
    nothing usable; the log's banner and engine line are read first, this is the fallback."""
    from servelab.core import bounded_http, credentials
    from servelab.core.timeouts import HTTP_PROBE_S

    try:
        answer = bounded_http.fetch(url, "/version", deadline_s=HTTP_PROBE_S,
                                    headers=credentials.headers())
        body = bounded_http.json_of(answer)[0]
    except ValueError:
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return version if isinstance(version, str) else None


def record(db_path: str | Path, run_id: str, verdict: Verdict, extra: dict | None = None) -> None:
    """Store the verdict on a run: ``runs.verification`` (with ``extra``, e.g. the preflight
    report) and the ``unverified`` or ``variant_mismatch`` flag."""
    from servelab.analysis.views import open_results_db

    if not Path(db_path).is_file():
        raise ServelabError(f"{db_path}: no such database; record the run first (`servelab run "
                            f"--db {db_path}`) or pass the --db that holds run {run_id!r}")
    con = open_results_db(db_path)
    try:
        found = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        if not found:
            raise ServelabError(f"{db_path}: no run {run_id!r} in table runs; list runs with "
                                f"`servelab runs --db {db_path}`")
        con.execute(
            "UPDATE runs SET verification = ?::JSON, flags = list_distinct(list_concat("
            "list_filter(coalesce(flags, []::VARCHAR[]), lambda x: x NOT IN (?, ?)), ?::VARCHAR[])) "
            "WHERE run_id = ?",
            [verdict.to_json(extra), FLAG_UNVERIFIED, FLAG_MISMATCH, verdict.flags, run_id])
    finally:
        con.close()


def verify_target_run(db_path: str | Path, run_id: str, variant: Variant, url: str,
                      log_path: str | Path | None = None) -> Verdict:
    """``servelab run --target URL --variant V``: judge the server the run measured from its
    ``/metrics`` (and its log, if given) and record the verdict on the run, so a run against a
    server that cannot show what it runs is flagged ``unverified`` (or ``variant_mismatch``)."""
    verdict = verify(variant, log_path=log_path, url=url)
    if not verdict.sources:
        verdict.checks.insert(0, Check("evidence", UNKNOWN, f"{url.rstrip('/')}/metrics gave no "
                                       "page (the metrics check says why) and no --log was "
                                       "given: nothing to verify from"))
    record(db_path, run_id, verdict, {"backend": "target", "url": url,
                                      "log": str(log_path) if log_path else None})
    return verdict
