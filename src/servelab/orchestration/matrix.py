"""``servelab matrix``: every variant in turn on the same hardware and traffic, then the comparison.

For each variant (and each repeat): preflight; bring the server up; wait for /health; verify what it
runs from its log and /metrics; reset the prefix cache where the server allows; run the profile
with ``servelab run``; record the verdict on the run; stop the server. Optionally collect greedy
outputs for the fidelity comparison while the server is up. Then the analysis compares the runs and
writes the report, and ``matrix.md`` puts speed, verification and fidelity side by side.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.orchestration import backends, fidelity
from servelab.orchestration import preflight as pf
from servelab.orchestration import verify as vf
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
    startup_timeout_s: float = 1800.0
    force: bool = False
    fidelity_prompts: str | None = None    # collect outputs for fidelity when set
    run_args: list[str] = field(default_factory=list)  # extra `servelab run` flags
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


def _preflight(variant: Variant, opt: MatrixOptions) -> pf.PreflightReport | None:
    from servelab.orchestration.gpus import read_gpus, read_topology

    if opt.backend in ("sim", "predict"):
        gpus = pf.gpus_from_hardware(opt.hardware, variant.gpus)
        source, links = f"simulated {opt.hardware}", None
    elif opt.gpus_file or opt.backend in ("local", "compose"):
        gpus = read_gpus(opt.gpus_file)
        source = opt.gpus_file or "nvidia-smi"
        links = read_topology(opt.topology_file) if opt.topology_file else None
    else:
        return None  # external server on unknown hardware: nothing to check against
    return pf.run_preflight(variant, gpus, source, links, pf.profile_lengths(opt.profile))


def _run_profile(entry: Entry, url: str, opt: MatrixOptions, matrix_id: str) -> str:
    """``servelab run`` against the server, as a child process (Locust patches its process),
    under a run id the matrix chooses."""
    run_id = f"{matrix_id}-{entry.variant.name}-r{entry.repeat}"
    command = [sys.executable, "-m", "servelab.cli", "run", "--profile", opt.profile,
               "--target", url, "--variant", entry.variant.name, "--db", str(opt.db), "--quiet",
               "--run-id", run_id,
               "--tag", f"matrix={matrix_id}", "--tag", f"repeat={entry.repeat}",
               "--tag", f"backend={opt.backend}"]
    if opt.backend == "sim":
        command += ["--hardware", opt.hardware]
    if opt.seed is not None:
        command += ["--seed", str(opt.seed)]
    command += opt.run_args
    done = subprocess.run(command, text=True, capture_output=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0 or not _run_exists(opt.db, run_id):
        raise ServelabError(f"servelab run for {entry.variant.name} failed ({done.returncode}):\n"
                            f"{done.stderr.strip()[-1500:]}")
    return run_id


def _run_exists(db: Path, run_id: str) -> bool:
    import duckdb

    if not Path(db).is_file():
        return False
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is not None
    finally:
        con.close()


def _measure(entry: Entry, opt: MatrixOptions, matrix_id: str, report, prompts,
             outputs: dict) -> None:
    variant = entry.variant
    suffix = f"-r{entry.repeat}" if opt.repeat > 1 else ""
    server = backends.start_server(opt.backend, variant, opt.logs, hardware=opt.hardware,
                                   url=opt.url, seed=opt.seed or 0, suffix=suffix)
    try:
        backends.wait_healthy(server, opt.startup_timeout_s)
        server.refresh_log()
        entry.log = str(server.log_path) if server.log_path else None
        entry.verdict = vf.verify(variant, log_path=server.log_path, url=server.url,
                                  expected_kv_tokens=report.kv_tokens if report else None)
        _say(entry.verdict.summary())
        entry.prefix_cache_reset = backends.reset_prefix_cache(server.url)
        entry.run_id = _run_profile(entry, server.url, opt, matrix_id)
        if prompts is not None and entry.repeat == 1:
            _say(f"{variant.name}: greedy outputs for {len(prompts)} fidelity prompts")
            outputs[variant.name] = fidelity.collect(server.url, prompts)
    finally:
        server.stop()
    extra = {"preflight": entry.preflight, "prefix_cache_reset": entry.prefix_cache_reset,
             "backend": opt.backend, "log": entry.log}
    vf.record(opt.db, entry.run_id, entry.verdict, extra)
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
    matrix_id = time.strftime("mx%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    prompts = (fidelity.load_prompts(opt.fidelity_prompts)
               if opt.fidelity_prompts and opt.backend != "predict" else None)
    outputs: dict[str, dict] = {}
    entries = []
    for variant in variants:
        report = _preflight(variant, opt)
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
        result.fidelity_id = fidelity.new_id()
        for name, out in outputs.items():
            if name == base:
                continue
            rows = fidelity.compare(prompts, outputs[base], out)
            fidelity.record(opt.db, result.fidelity_id, base, name, rows, backend=opt.backend,
                            hardware=opt.hardware if opt.backend == "sim" else None,
                            prompt_set=str(opt.fidelity_prompts), seed=0, matrix_id=matrix_id)
            result.fidelity[name] = fidelity.summarize(rows)
        result.fidelity = {"baseline": base, "candidates": result.fidelity}
    return result


# -- the side-by-side table ------------------------------------------------------------------------

SPEED_SQL = """
SELECT s.run_id, s.stage, s.level, s.requests, s.error_rate, s.ttft_p50_ms, s.ttft_p99_ms,
       s.tpot_p50_ms, s.itl_p50_ms, s.output_tokens_per_s, s.goodput, s.slo_attainment
FROM stage_summary s
WHERE s.class_name = '(all)' AND s.run_id IN (SELECT unnest(?::VARCHAR[]))
ORDER BY s.run_id, s.stage
"""


def speed_rows(db: Path, run_ids: list[str]) -> dict[str, list[dict]]:
    from servelab.analysis.views import open_results_db

    if not run_ids:
        return {}
    con = open_results_db(db)
    try:
        cur = con.execute(SPEED_SQL, [run_ids])
        names = [d[0] for d in cur.description]
        out: dict[str, list[dict]] = {}
        for row in cur.fetchall():
            item = dict(zip(names, row))
            out.setdefault(item["run_id"], []).append(item)
        return out
    finally:
        con.close()


def _fmt(value, spec: str = ".1f", unit: str = "") -> str:
    if value is None:
        return "-"
    try:
        return f"{value:{spec}}{unit}"
    except (TypeError, ValueError):
        return str(value)


def render_table(result: MatrixResult, speed: dict[str, list[dict]]) -> str:
    """Markdown: per variant and repeat, the verification, the highest load level's speed, and
    fidelity against the first variant."""
    fid = result.fidelity.get("candidates", {}) if result.fidelity else {}
    base = result.fidelity.get("baseline") if result.fidelity else None
    head = ("| variant | repeat | status | verified | level | tok/s | TTFT p50 ms | TTFT p99 ms | "
            "TPOT p50 ms | goodput req/s | errors | exact match | 1st divergence | similarity |")
    lines = [f"# servelab matrix {result.matrix_id}", "",
             "Speed at the highest load level of the profile (all classes, measured window); "
             "fidelity against " + (f"`{base}`" if base else "the first variant") +
             " (greedy outputs). A run that is not `verified` says so here: read its numbers "
             "as those of whatever the server really ran.", "", head,
             "|" + "---|" * 14]
    for e in result.entries:
        stages = speed.get(e.run_id or "", [])
        top = stages[-1] if stages else {}
        verified = e.verdict.status if e.verdict else ("predicted" if e.status == "predicted"
                                                       else "-")
        f = fid.get(e.variant.name) if e.repeat == 1 else None
        if e.variant.name == base and e.repeat == 1:
            fx = ("baseline", "", "")
        elif f:
            fx = (_fmt(f["exact_match_rate"], ".0%"), _fmt(f["mean_first_divergence"], ".1f"),
                  _fmt(f["mean_similarity"], ".3f"))
        else:
            fx = ("-", "-", "-")
        lines.append(
            f"| {e.variant.name} | {e.repeat} | {e.status} | {verified} | {_fmt(top.get('level'), 'g')} | "
            f"{_fmt(top.get('output_tokens_per_s'))} | {_fmt(top.get('ttft_p50_ms'))} | "
            f"{_fmt(top.get('ttft_p99_ms'))} | {_fmt(top.get('tpot_p50_ms'), '.2f')} | "
            f"{_fmt(top.get('goodput'), '.2f')} | {_fmt(top.get('error_rate'), '.1%')} | "
            f"{fx[0]} | {fx[1]} | {fx[2]} |")
    notes = [e for e in result.entries if e.error or (e.verdict and e.verdict.status != "verified")]
    if notes:
        lines += ["", "## Notes", ""]
        for e in notes:
            if e.error:
                lines.append(f"- {e.variant.name} (repeat {e.repeat}): {e.status}: {e.error}")
            if e.verdict and e.verdict.status != "verified":
                bad = [c for c in e.verdict.checks if c.status in ("fail", "unknown", "warn")]
                lines.append(f"- {e.variant.name} (repeat {e.repeat}): {e.verdict.status}: "
                             + "; ".join(f"{c.name}: {c.detail}" for c in bad))
    return "\n".join(lines) + "\n"


def to_json(result: MatrixResult, speed: dict) -> dict:
    return {"matrix_id": result.matrix_id, "fidelity_id": result.fidelity_id,
            "fidelity": result.fidelity,
            "entries": [{"variant": e.variant.name, "repeat": e.repeat, "status": e.status,
                         "run_id": e.run_id, "error": e.error, "log": e.log,
                         "prefix_cache_reset": e.prefix_cache_reset,
                         "verification": json.loads(e.verdict.to_json()) if e.verdict else None,
                         "preflight": e.preflight, "speed": speed.get(e.run_id or "", [])}
                        for e in result.entries]}


def compare_and_report(result: MatrixResult, db: Path, out: Path, report: bool = True) -> list[str]:
    """``servelab compare`` (printed) and ``servelab report`` (into ``out``) over the matrix's runs,
    through the analysis commands themselves. Returns the problems met, also printed."""
    problems = []
    runs = result.run_ids
    groups = {e.variant.name for e in result.entries if e.run_id}
    steps = []
    if len(groups) > 1:
        steps.append(("compare", [*runs, "--db", str(db)]))
    if report:
        steps.append(("report", [*runs, "--db", str(db), "--out", str(out)]))
    for name, args in steps:
        done = subprocess.run([sys.executable, "-m", "servelab.cli", name, *args], text=True,
                              capture_output=True)
        sys.stdout.write(done.stdout)
        if done.returncode != 0:
            problem = f"servelab {name} failed ({done.returncode}): {done.stderr.strip()[-800:]}"
            problems.append(problem)
            print(problem, file=sys.stderr, flush=True)
    return problems
