#!/usr/bin/env python
"""The engine steps a recorded run made beside the ones ``servelab predict`` makes of it (issue 22).

    python bench/fidelity_steps.py servers/captured/h200_20261202/bf16 --variant bf16
        [--runs code_gen,rag_chat] [--levels 8,16,64]

A real vLLM 0.26 logs every step with ``--enable-logging-iteration-details`` (the capture's
``server_iterations``: context requests/tokens, generation requests per step; the lines are
stamped to the second, so the count per measured second is the step rate). The same run's
profile replayed by ``servelab predict`` (``fidelity_capture.predict_run``'s engine flags and
calibration) is recorded step by step here. Per stage it prints, recorded and predicted: steps
per second, the share of steps that carry any prefill, the shares by the step's prefill tokens
(1-511, 512-2,047, 2,048-4,095, 4,096-8,000, a full 8,192-token budget) and the mean decodes per
step, and the flood size: a flood is a run of consecutive steps that carry prefill, its size
their prompt tokens, printed as the token-weighted median (what a prompt token sees). Equal
shapes with a different step rate say the steps are priced wrong (the cost model); different
shapes say the requests reach the engine differently (the API server's hand-off, the engine
core's input thread).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import fidelity_capture as fc  # noqa: E402  (a sibling script, not a package)

BANDS = ((1, 512), (512, 2048), (2048, 4096), (4096, 8001), (8001, 10 ** 9))


def flood_tokens(prefill: list[int]) -> float:
    """The token-weighted median size of the floods in a run of steps' prefill tokens."""
    floods, run = [], 0
    for p in list(prefill) + [0]:
        if p > 0:
            run += p
        elif run:
            floods.append(run)
            run = 0
    if not floods:
        return 0.0
    floods.sort()
    half, seen = sum(floods) / 2, 0
    for f in floods:
        seen += f
        if seen >= half:
            return float(f)
    return float(floods[-1])


def shape_row(steps: list[tuple[int, int]], seconds: float) -> dict:
    """(prefill tokens, decodes) per step, in order, over ``seconds`` -> the figures printed
    per stage."""
    n = max(1, len(steps))
    return {"steps_per_s": len(steps) / seconds,
            "with_prefill": sum(p > 0 for p, _ in steps) / n,
            "bands": [sum(lo <= p < hi for p, _ in steps) / n for lo, hi in BANDS],
            "decodes": sum(d for _, d in steps) / n,
            "flood": flood_tokens([p for p, _ in steps])}


def recorded(con, run: str) -> dict[int, dict]:
    """Per level: the recorded steps of the measured window's whole log seconds."""
    out = {}
    for level, a, b in con.execute("SELECT level, measure_start_unix, measure_end_unix FROM "
                                   "stages WHERE run_id = ? ORDER BY stage", [run]).fetchall():
        lo, hi = int(a) + 1, int(b)
        steps = con.execute("SELECT context_tokens, generation_requests FROM server_iterations "
                            "WHERE run_id = ? AND log_second_unix >= ? AND log_second_unix < ? "
                            "ORDER BY iteration",
                            [run, lo, hi]).fetchall()
        if hi > lo:
            out[int(level)] = shape_row(steps, hi - lo)
    return out


@contextmanager
def logged_steps():
    """Every step any engine makes meanwhile, as (virtual start, prefill tokens, decodes)."""
    from servelab.sim.engine.engine import Engine

    steps: list[tuple[float, int, int]] = []
    step = Engine.step

    def logged(self, now):
        out = step(self, now)
        if out.duration_s > 0 and out.shape.num_seqs:
            steps.append((now, out.shape.prefill_tokens, out.shape.num_decode))
        return out
    Engine.step = logged
    try:
        yield steps
    finally:
        Engine.step = step


def predicted(capture: Path, variant: str, run: str, profile: Path, work: Path) -> dict[int, dict]:
    """Per level: the steps of ``servelab predict``'s replay of ``profile`` in each stage's
    measured window (virtual time from the predicted run's start)."""
    import duckdb

    from servelab.orchestration.predict import predict
    from servelab.specs.variants import load_variant

    spec = fc.write_variant(work, variant, capture)
    db = work / f"{run}.duckdb"
    with logged_steps() as steps:
        res = predict(load_variant(spec), fc.HARDWARE, profile, db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        anchor = con.execute("SELECT started_unix FROM runs WHERE run_id = ?",
                             [res.run_id]).fetchone()[0]
        stages = con.execute("SELECT level, measure_start_unix, measure_end_unix FROM stages "
                             "WHERE run_id = ? ORDER BY stage", [res.run_id]).fetchall()
    finally:
        con.close()
    out = {}
    for level, a, b in stages:
        inside = [(p, d) for t, p, d in steps if a <= anchor + t < b]
        out[int(level)] = shape_row(inside, b - a)
    return out


def compare(capture: Path, variant: str, run: str, work: Path) -> dict[int, tuple[dict, dict]]:
    """{level: (recorded, predicted)} for one recorded run."""
    con = fc.open_export(capture / run)
    try:
        real = recorded(con, run)
        profile = fc.profile_of(con, capture, run, work)
    finally:
        con.close()
    pred = predicted(capture, variant, run, profile, work)
    return {lvl: (real[lvl], pred[lvl]) for lvl in real if lvl in pred}


def fmt(row: dict) -> str:
    bands = " ".join(f"{x:5.2f}" for x in row["bands"])
    return (f"{row['steps_per_s']:7.0f} {row['with_prefill']:8.2f}   {bands} "
            f"{row['decodes']:8.0f} {row['flood']:7.0f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture", type=Path)
    ap.add_argument("--variant", default="bf16")
    ap.add_argument("--runs", default=None)
    ap.add_argument("--levels", default=None)
    args = ap.parse_args(argv)
    runs = args.runs.split(",") if args.runs else sorted(
        p.name for p in args.capture.iterdir() if (p / "runs.parquet").is_file())
    levels = {int(x) for x in args.levels.split(",")} if args.levels else None
    work = Path(tempfile.mkdtemp(prefix="servelab-fidelity-steps-"))
    head = "  steps/s  prefill   1-511 -2047 -4095 -8000  full  decodes   flood"
    for run in runs:
        print(f"\n{run} ({args.variant})\nusers        {head}")
        for level, (real, pred) in sorted(compare(args.capture, args.variant, run, work).items()):
            if levels is None or level in levels:
                print(f"{level:>5} recorded {fmt(real)}\n{'':>5} predicted{fmt(pred)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
