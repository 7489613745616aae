"""The two paths ``servelab demo`` takes, and its answer.

- measured: the matrix on the ``sim`` back-end (one simulated vLLM process per variant, Locust
  sending the profile's requests, every request stored), then greedy-output fidelity against the
  first variant, then the matrix table and the comparison;
- predicted: the same variants through ``servelab predict`` (virtual time) on the write-up's sweep;
- the answer: read back from the database over both paths' runs (analysis.answer), printed, and
  put first in the measured runs' report with its figure.

Fidelity is collected here rather than by the matrix: the matrix asks 8 prompts at a time while
each server is up, which on the simulator takes longer than the load itself (43 s of a 95 s demo);
a second start of every variant's server at once, each answering every prompt at once, gives the
same greedy outputs (temperature 0, seed 0) in a fifth of that, recorded under the measured
matrix's id all the same.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.orchestration import fidelity, matrix


@dataclass
class DemoOptions:
    variants: list  # specs.variants.Variant, the first is the baseline
    hardware: str
    db: Path
    out: Path
    measured_profile: str
    predicted_profile: str
    fidelity_prompts: str | None  # None: no fidelity


def measured(opt: DemoOptions) -> tuple[matrix.MatrixResult, int]:
    """The sim-backed matrix, fidelity, then its table and comparison (no report yet: the report
    opens with the answer, which needs the predicted runs too)."""
    mopt = matrix.MatrixOptions(profile=opt.measured_profile, backend="sim", hardware=opt.hardware, db=opt.db)
    result = matrix.run_matrix(opt.variants, mopt)
    failed = False
    if opt.fidelity_prompts and len(result.run_ids) > 1:
        try:
            _fidelity(result, opt, mopt.logs)
        except ServelabError as exc:  # the speed figures stand without it; the exit status says so
            print(f"fidelity FAILED: {exc}", flush=True)
            failed = True
    return result, matrix.finish(result, opt.db, opt.out, report=False) or int(failed)


def _fidelity(result: matrix.MatrixResult, opt: DemoOptions, logs: Path) -> None:
    prompts = fidelity.load_prompts(opt.fidelity_prompts)
    names = {e.variant.name for e in result.entries if e.run_id}
    variants = [v for v in opt.variants if v.name in names]
    # One server per variant, all up at once: greedy outputs do not depend on how fast they come.
    with ThreadPoolExecutor(max_workers=len(variants)) as pool:
        got = pool.map(lambda v: fidelity.collect_from_variants(
            "sim", [v], prompts, logs, hardware=opt.hardware, parallel=len(prompts)), variants)
        outputs = {name: out for one in got for name, out in one.items()}
    base = variants[0].name
    result.fidelity_id, summaries = fidelity.compare_and_record(
        opt.db, prompts, outputs, base, backend="sim", hardware=opt.hardware,
        prompt_set=str(opt.fidelity_prompts), seed=0, matrix_id=result.matrix_id)
    result.fidelity = {"baseline": base, "candidates": summaries}


def predicted(opt: DemoOptions) -> tuple[matrix.MatrixResult, int]:
    """The matrix on the predict back-end; its table (matrix.md and matrix.json under
    OUT/predicted) is printed, its per-stage comparison is not: the answer reads it."""
    from servelab.orchestration.matrix_table import render_table, speed_rows, to_json

    mopt = matrix.MatrixOptions(profile=opt.predicted_profile, backend="predict", hardware=opt.hardware, db=opt.db)
    result = matrix.run_matrix(opt.variants, mopt)
    out = Path(opt.out) / "predicted"
    out.mkdir(parents=True, exist_ok=True)
    speed = speed_rows(opt.db, result.run_ids)
    table = render_table(result, speed)
    (out / "matrix.md").write_text(table, encoding="utf-8")
    (out / "matrix.json").write_text(json.dumps(to_json(result, speed), indent=2, default=str), encoding="utf-8")
    print("\n" + table + f"matrix {result.matrix_id}: {out / 'matrix.md'}", flush=True)
    failed = [e for e in result.entries if e.status in ("failed", "refused")]
    return result, 1 if failed or not result.run_ids else 0


def answer(opt: DemoOptions, measured_runs: list[str], predicted_runs: list[str]) -> tuple[str, Path | None]:
    """The answer over both paths' runs, as text, and the measured runs' report opening with it
    (None when no measured run was recorded)."""
    from servelab.analysis.answer import read_answer
    from servelab.analysis.answer_plot import crossover_figure
    from servelab.analysis.answer_text import render_html, render_text
    from servelab.analysis.db import open_for_reading
    from servelab.analysis.report import write_report
    from servelab.analysis.report_html import img

    con = open_for_reading(opt.db)
    try:
        result = read_answer(con, measured_runs + predicted_runs)
    finally:
        con.close()
    out = Path(opt.out)
    out.mkdir(parents=True, exist_ok=True)
    png, facts = crossover_figure(result, out / "crossover.png")
    figure = img(png, "Output tokens/s against load per variant, predicted and measured panels, crossover shaded",
                 "Output tokens/s per load level and variant, one panel per path (each titled measured or "
                 "predicted); shaded: where the throughput leader changes; ringed: each variant's first load "
                 "below the SLO target.", facts)
    report = write_report(opt.db, measured_runs, out, opening=render_html(result, figure)) if measured_runs else None
    return render_text(result), report


__all__ = ["DemoOptions", "answer", "measured", "predicted"]
