"""``servelab matrix``: every variant in turn on the same hardware and traffic, then the comparison.

For each variant (and each repeat): preflight; bring the server up; wait for /health; verify what it
runs from its log and /metrics; reset the prefix cache where the server allows; run the profile
through the runner (in this process; Locust gets its own processes there); record the verdict on
the run; stop the server. Optionally collect greedy outputs for the fidelity comparison while the
server is up. Then the analysis layer compares the runs and writes the report (in this process
too), and ``matrix.md`` (matrix_table.py) puts speed, verification and fidelity side by side.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core import credentials, procs
from servelab.core.errors import ServelabError
from servelab.core.timeouts import SERVER_STARTUP_S
from servelab.orchestration import backends, fidelity
from servelab.orchestration import verify as vf
from servelab.orchestration.preflight_sources import matrix_preflight
from servelab.specs.variants import Variant


@dataclass
class MatrixOptions:
    profile: str
    backend: str = "sim"
    hardware: str = "L40S"
    repeat: int = 1
    db: Path = Path("results/servelab.duckdb")
    out: Path | None = None
    url: str | None = None
    gpus_file: str | None = None
    topology_file: str | None = None
    seed: int | None = None
    startup_timeout_s: float = SERVER_STARTUP_S
    force: bool = False
    fidelity_prompts: str | None = None    # collect outputs for fidelity when set
    run_fields: dict = field(default_factory=dict)  # RunOptions fields from --run-arg flags
    logs: Path | None = None


@dataclass
class Entry:
    variant: Variant
    repeat: int
    status: str = "pending"     # measured | predicted | refused | failed
    run_id: str | None = None
    preflight: dict | None = None
    verdict: vf.Verdict | None = None
    prefix_cache_reset: bool | None = None
    error: str | None = None
    log: str | None = None


@dataclass
class MatrixResult:
    matrix_id: str
    entries: list[Entry]
    fidelity_id: str | None = None
    fidelity: dict = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        return [e.run_id for e in self.entries if e.run_id]


def _say(text: str) -> None:
    print(text, flush=True)


def _run_profile(entry: Entry, url: str, opt: MatrixOptions, matrix_id: str,
                 otlp_port: int | None = None) -> str:
    """The runner against the server, under a run id the matrix chooses; the ``--run-arg``
    fields come last, as the extra flags came last on ``servelab run``'s command line."""
    from servelab.orchestration.runner import RunOptions, run_profile

    run_id = f"{matrix_id}-{entry.variant.name}-r{entry.repeat}"
    fields = {"profile": opt.profile, "target": url, "variant": entry.variant.name,
              "db": opt.db, "quiet": True, "run_id": run_id, "seed": opt.seed,
              "hardware": opt.hardware if opt.backend == "sim" else None,
              **opt.run_fields,
              # the receiver's port the server was started with (backends.start_server)
              **({"otlp_port": otlp_port} if otlp_port else {}),
              "tags": {"matrix": matrix_id, "repeat": entry.repeat, "backend": opt.backend,
                       **opt.run_fields.get("tags", {})}}
    try:
        result = run_profile(RunOptions(**fields))
    except ServelabError as exc:
        raise ServelabError(f"servelab run for {entry.variant.name} failed: {exc}") from None
    if result.interrupted:
        raise KeyboardInterrupt  # Ctrl-C stops the whole matrix, after this run's record
    if result.exit_code != 0:
        raise ServelabError(f"servelab run for {entry.variant.name} failed: the run ended "
                            f"{result.status}; see {result.logs}")
    return run_id


def _measure(entry: Entry, opt: MatrixOptions, matrix_id: str, report, prompts,
             outputs: dict) -> None:
    variant = entry.variant
    suffix = f"-r{entry.repeat}" if opt.repeat > 1 else ""
    # the run's span receiver, fixed before the server starts: the server needs its address
    otlp_port = procs.free_port() if opt.backend in ("sim", "local", "compose") else None
    server = backends.start_server(opt.backend, variant, opt.logs, hardware=opt.hardware,
                                   url=opt.url, seed=opt.seed or 0, suffix=suffix,
                                   otlp_port=otlp_port)
    try:
        backends.wait_healthy(server, opt.startup_timeout_s)
        server.refresh_log()
        entry.log = str(server.log_path) if server.log_path else None
        entry.verdict = vf.verify(variant, log_path=server.log_path, url=server.url,
                                  expected_kv_tokens=report.kv_tokens if report else None)
        _say(entry.verdict.summary())
        entry.prefix_cache_reset = backends.reset_prefix_cache(
            server.url, path=server.variant.kind.reset_prefix_cache_path)
        entry.run_id = _run_profile(entry, server.url, opt, matrix_id, otlp_port)
        if prompts is not None and entry.repeat == 1:
            _say(f"{variant.name}: greedy outputs for {len(prompts)} fidelity prompts")
            outputs[variant.name] = fidelity.collect(server.url, prompts)
    finally:
        server.stop()
    extra = {"preflight": entry.preflight, "prefix_cache_reset": entry.prefix_cache_reset,
             "backend": opt.backend, "log": entry.log}
    vf.record(opt.db, entry.run_id, entry.verdict, extra)
    if server.log_path is not None:   # the engine's iteration lines, once the log is complete
        from servelab.core.paths import default_db
        from servelab.orchestration.server_telemetry import ingest_after_run

        ingest_after_run(Path(opt.db) if opt.db else default_db(), entry.run_id, server.log_path,
                         None)
    entry.status = "measured"


def _predict(entry: Entry, opt: MatrixOptions, matrix_id: str) -> None:
    from servelab.orchestration.predict import predict

    result = predict(entry.variant, opt.hardware, opt.profile, opt.db, seed=opt.seed,
                     tags={"matrix": matrix_id, "repeat": entry.repeat, "backend": "predict"})
    entry.run_id = result.run_id
    entry.status = "predicted"


def run_matrix(variants: list[Variant], opt: MatrixOptions) -> MatrixResult:
    if opt.repeat < 1:
        raise ServelabError("--repeat: at least 1")
    if opt.backend not in backends.BACKENDS:
        raise ServelabError(f"--backend {opt.backend}: allowed {', '.join(backends.BACKENDS)}")
    opt.db = Path(opt.db)
    opt.logs = Path(opt.logs) if opt.logs else opt.db.parent / "logs"
    # An external --url's user:password and the run's key become this process's credentials
    # (core.credentials: verify, fidelity and every run send them); the clean URL is what every
    # step sees and records.
    opt.url, creds = credentials.build(opt.run_fields.get("api_key"),
                                       opt.run_fields.get("headers"), opt.url)
    credentials.install(creds)
    matrix_id = time.strftime("mx%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    prompts = (fidelity.load_prompts(opt.fidelity_prompts)
               if opt.fidelity_prompts and opt.backend != "predict" else None)
    outputs: dict[str, dict] = {}
    entries = []
    for variant in variants:
        report = matrix_preflight(variant, opt.backend, opt.hardware, opt.profile,
                                  opt.gpus_file, opt.topology_file, url=opt.url)
        for k in range(1, opt.repeat + 1):
            entry = Entry(variant, k, preflight=report.to_dict() if report else None)
            entries.append(entry)
            if k == 1 and report is not None:
                _say(report.render())
            if report is not None and report.refused and not opt.force:
                entry.status = "refused"
                entry.error = "; ".join(v.reason for v in report.verdicts if v.level == "refuse")
                _say(f"{variant.name}: skipped (preflight refused it; --force runs it anyway)")
                continue
            _say(f"== {variant.name} (repeat {k}/{opt.repeat}, backend {opt.backend})")
            try:
                if opt.backend == "predict":
                    _predict(entry, opt, matrix_id)
                else:
                    _measure(entry, opt, matrix_id, report, prompts, outputs)
            except ServelabError as exc:
                entry.status, entry.error = "failed", str(exc)
                _say(f"{variant.name}: FAILED: {exc}")
    result = MatrixResult(matrix_id, entries)
    if prompts is not None and len(outputs) > 1:
        base = next(v.name for v in variants if v.name in outputs)
        result.fidelity_id, summaries = fidelity.compare_and_record(
            opt.db, prompts, outputs, base, backend=opt.backend,
            hardware=opt.hardware if opt.backend == "sim" else None,
            prompt_set=str(opt.fidelity_prompts), seed=0, matrix_id=matrix_id)
        result.fidelity = {"baseline": base, "candidates": summaries}
    return result


def finish(result: MatrixResult, db: Path, out: Path | None, report: bool = True) -> int:
    """Write matrix.md and matrix.json, print the table, compare and report the runs; the exit
    status of ``servelab matrix`` (1 when a variant failed or was refused, or nothing ran)."""
    from servelab.orchestration.matrix_table import render_table, speed_rows, to_json

    out = Path(out) if out else Path("reports") / result.matrix_id
    out.mkdir(parents=True, exist_ok=True)
    speed = speed_rows(db, result.run_ids)
    table = render_table(result, speed)
    (out / "matrix.md").write_text(table, encoding="utf-8")
    (out / "matrix.json").write_text(json.dumps(to_json(result, speed), indent=2, default=str),
                                     encoding="utf-8")
    print()
    print(table)
    problems = compare_and_report(result, db, out, report) if result.run_ids else []
    print(f"matrix {result.matrix_id}: {out / 'matrix.md'}, {out / 'matrix.json'}")
    incomplete = [e for e in result.entries if e.status in ("failed", "refused")]
    return 1 if incomplete or problems or not result.run_ids else 0


def compare_and_report(result: MatrixResult, db: Path, out: Path, report: bool = True) -> list[str]:
    """``servelab compare`` (printed) and ``servelab report`` (into ``out``) over the matrix's runs,
    through the analysis layer's own functions. Returns the problems met, also printed."""
    import duckdb

    problems = []
    runs = result.run_ids
    steps = []
    if len({e.variant.name for e in result.entries if e.run_id}) > 1:
        steps.append(("compare", lambda: _compare(db, runs)))
    if report:
        steps.append(("report", lambda: _report(db, runs, out)))
    for name, step in steps:
        try:
            step()
        except (ServelabError, duckdb.Error) as exc:
            problem = f"servelab {name} failed: {str(exc)[-800:]}"
            problems.append(problem)
            print(problem, file=sys.stderr, flush=True)
    return problems


def _compare(db: Path, runs: list[str]) -> None:
    from servelab.analysis.compare import compare_runs

    compare_runs(db, runs)


def _report(db: Path, runs: list[str], out: Path) -> None:
    from servelab.analysis.report import write_report

    path = write_report(db, runs, out)
    _say(f"wrote {path} and its PNG figures in {path.parent}")
