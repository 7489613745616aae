#!/usr/bin/env python
"""Does ``servelab predict`` say what ``servelab run`` against ``servelab sim`` measures?

Section "time model" (issue 13, item 2): one short closed-loop profile, run both ways with the
same variant, hardware and seed into one DuckDB file:

1. real time: ``servelab run --profile P --variant V --hardware H`` (it starts ``servelab sim``,
   Locust streams over real sockets, users ramp at the spawn rate, stages end on ticks);
2. virtual time: ``servelab predict --variant V --hardware H --profile P``, which times the stages
   with ``sim.engine.virtual_stages`` (the same plan) and drives the same engine without sleeping.

It prints, per stage, each side's measured window and the figures of the ``stage_summary`` view
(TTFT p50, TPOT p50, output tokens/s, requests) with the ratio predict / run. The target is within
10% for TTFT p50, TPOT p50 and tokens/s. Both sides are the simulator's engine, so what is left is
the timing of the real path (HTTP, the tokenizer, Locust's scheduling on a busy machine, a step a
little late), not the cost model. Figures are exact per run (the views' exact quantiles); the
real-time side is one sample of a noisy machine, so repeat it (``--repeat``) before trusting a
difference under a few percent.

Section "real GPU" (issue 13, item 5) is ``bench/fidelity_gpu.py``: every probe-calibrated variant
predicted against the ``vllm bench serve`` sweeps captured on the same H200. It runs first (in
virtual time, about a second); ``--gpu-only`` stops there.

Usage: python bench/fidelity.py [--gpu-only] [--variant bf16] [--hardware H100] [--levels 1,8,32]
                                [--hold 8] [--warmup 2] [--repeat 1] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = """name: fidelity_time
description: bench/fidelity.py's time-model profile (one class, fixed seed)
endpoint: completions
model: auto
seed: {seed}
classes:
  - name: chat
    prompt_tokens: {{kind: uniform, min: 256, max: 1024}}
    output_tokens: {{kind: uniform, min: 64, max: 192}}
load:
  concurrency: {{levels: [{levels}], warmup: {warmup}s, hold: {hold}s}}
"""
FIGURES = [("ttft_p50_ms", "TTFT p50 ms"), ("tpot_p50_ms", "TPOT p50 ms"),
           ("output_tokens_per_s", "tok/s"), ("requests", "requests")]


def _servelab(*args: str) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "servelab.cli", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:1])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - t0


def _stages(db: Path, run_id: str) -> dict[int, dict]:
    import duckdb

    from servelab.analysis.views import open_results_db

    open_results_db(db).close()   # installs the views on this file
    con = duckdb.connect(str(db), read_only=True)
    try:
        cols = ", ".join(f"s.{c}" for c, _ in FIGURES)
        rows = con.execute(
            f"SELECT s.stage, s.level, {cols}, g.measure_start_unix - g.started_unix, "
            "g.measure_end_unix - g.measure_start_unix FROM stage_summary s JOIN stages g "
            "USING (run_id, stage) WHERE s.run_id = ? AND s.class_name = '(all)' ORDER BY 1",
            [run_id]).fetchall()
    finally:
        con.close()
    return {r[0]: {"level": r[1], **{c: r[2 + i] for i, (c, _) in enumerate(FIGURES)},
                   "window": (r[-2], r[-1])} for r in rows}


def _run_ids(db: Path) -> dict[str, str]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT run_id, list_contains(flags, 'predicted') FROM runs "
                           "ORDER BY started_unix").fetchall()
    finally:
        con.close()
    return {"predict" if pred else "run": rid for rid, pred in rows}


def one_pair(args, work: Path, rep: int) -> tuple[dict, dict, float, float]:
    db = work / f"fidelity-{rep}.duckdb"
    profile = work / "fidelity_time.yaml"
    profile.write_text(PROFILE.format(seed=args.seed, levels=args.levels.replace(",", ", "),
                                      warmup=args.warmup, hold=args.hold))
    common = ["--variant", args.variant, "--hardware", args.hardware, "--profile", str(profile),
              "--db", str(db), "--seed", str(args.seed)]
    run_s = _servelab("run", *common, "--quiet", "--spool-dir", str(work / "spool"))
    pred_s = _servelab("predict", *common)
    ids = _run_ids(db)
    return _stages(db, ids["run"]), _stages(db, ids["predict"]), run_s, pred_s


def _ratio(p, r) -> str:
    return "-" if p is None or r in (None, 0) else f"{p / r:.3f}"


def report(real: dict, pred: dict) -> tuple[str, list[float]]:
    """Three lines per stage (run, predict, ratio), so the table stays inside 80 columns; the
    window is the measured window's start after the stage's start, plus its length (s)."""
    def num(v) -> str:
        return f"{v if v is not None else float('nan'):>12.1f}"

    head = f"{'stage':>5} {'users':>5} {'':8} {'window s':>10}" + "".join(
        f"{name:>12}" for _, name in FIGURES)
    lines, ratios = [head, "-" * len(head)], []
    for st in sorted(real):
        r, p = real[st], pred.get(st, {})
        rw = f"{r['window'][0]:.2f}+{r['window'][1]:.1f}"
        pw = f"{p['window'][0]:.2f}+{p['window'][1]:.1f}" if p else "-"
        lines.append(f"{st:>5} {r['level']:>5.0f} {'run':<8} {rw:>10}"
                     + "".join(num(r.get(c)) for c, _ in FIGURES))
        lines.append(f"{'':>11} {'predict':<8} {pw:>10}" + "".join(num(p.get(c)) for c, _ in FIGURES))
        lines.append(f"{'':>11} {'ratio':<8} {'':>10}"
                     + "".join(f"{_ratio(p.get(c), r.get(c)):>12}" for c, _ in FIGURES))
        ratios += [p[c] / r[c] for c, _ in FIGURES
                   if c != "requests" and p.get(c) is not None and r.get(c)]
    return "\n".join(lines), ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="bf16")
    ap.add_argument("--hardware", default="H100")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--hold", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", help="keep the database and profile in this folder")
    ap.add_argument("--gpu-only", action="store_true", help="only the real-GPU section")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    import fidelity_gpu

    print("== real GPU: calibrated predictions against captured vllm bench serve sweeps ==")
    fidelity_gpu.main([])
    if args.gpu_only:
        return 0
    print("\n== time model: servelab predict against servelab run on the simulator ==")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="servelab-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SERVELAB_DB", str(work / "unused.duckdb"))
    print(f"time model: {args.variant} on {args.hardware}, levels {args.levels}, warm-up "
          f"{args.warmup:g} s, hold {args.hold:g} s, seed {args.seed}\n(figures exact per run; "
          "window: its start after the stage's start + its length)")
    worst = 0.0
    for rep in range(args.repeat):
        real, pred, run_s, pred_s = one_pair(args, work, rep)
        table, ratios = report(real, pred)
        print(f"\n-- pair {rep + 1}: servelab run {run_s:.1f} s wall, predict {pred_s:.1f} s wall")
        print(table)
        off = max((abs(x - 1.0) for x in ratios), default=float("nan"))
        worst = max(worst, off)
        print(f"largest |ratio - 1| over TTFT p50, TPOT p50, tok/s: {off:.1%} (target 10%)")
    if args.keep:
        print(f"\nkept in {work}")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
