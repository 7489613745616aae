#!/usr/bin/env python
"""Predicted / measured for a recorded servelab run on a real server (issue 22).

A capture folder holds ``capture.duckdb`` (servelab's schema: the measured run of each profile,
run id = profile name) and the profiles it ran (``<run_id>.yaml``; else
``bench/fidelity_workloads/<run_id>.yaml``), plus ``cmd.txt`` (the server's command line). Every
profile is replayed by ``servelab predict`` (the simulator's engine in virtual time, priced by
the calibration that matches the server's flags) and each stage's figures from the same
``stage_summary`` view are printed predicted / measured: TTFT p50/p99, TPOT p50, ITL p99 and
output tokens/s, with issue 22's targets (15% for TTFT p50, TPOT p50, tokens/s; 25% for TTFT
p99, ITL p99).

Usage: python bench/fidelity_capture.py CAPTURE_DIR [--runs cap_chat,cap_prefill]
         [--variant bf16] [--hardware H200] [--classes] [--defaults] [--calibration FILE]
  --defaults: no calibration (the built-in coefficients); --calibration: price with that file
  --classes: a row per request class as well as the stage's (all)
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from capture_export import open_export  # noqa: E402  (a sibling script, not a package)
WORKLOADS = ROOT / "bench" / "fidelity_workloads"
MODEL, HARDWARE = "Qwen/Qwen2.5-7B-Instruct", "H200"
# The Int4 captures served the same model folder with a quantization_config (their cmd.txt names
# the folder, not the id): the checkpoints whose config it carries, as servers/variants has them.
MODELS = {"gptq_int4": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
          "awq_int4": "Qwen/Qwen2.5-7B-Instruct-AWQ"}
CLAIMS = {"gptq_int4": ("int4", "fp16"), "awq_int4": ("int4", "fp16")}
COLS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tokens_per_s")
SHORT = {"ttft_p50_ms": "ttft_p50", "ttft_p99_ms": "ttft_p99", "tpot_p50_ms": "tpot_p50",
         "itl_p99_ms": "itl_p99", "output_tokens_per_s": "tok_s"}
TARGETS = {"ttft_p50_ms": 0.15, "tpot_p50_ms": 0.15, "output_tokens_per_s": 0.15,
           "ttft_p99_ms": 0.25, "itl_p99_ms": 0.25}
# Flags of the capture's command line that change the engine (the rest: host, port, tracing).
ENGINE_FLAGS = ("--max-model-len", "--gpu-memory-utilization", "--kv-cache-memory-bytes",
                "--quantization", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype")


def serve_args(capture: Path, variant: str) -> list[str]:
    """The engine flags of the captured server (cmd.txt), or the calibration probes' own."""
    cmd = capture / "cmd.txt"
    if cmd.exists():
        words = shlex.split(cmd.read_text())
        out = []
        for i, w in enumerate(words):
            if w in ENGINE_FLAGS and i + 1 < len(words):
                out += [w, words[i + 1]]
        return out
    flags = ["--max-model-len", "4096", "--kv-cache-memory-bytes", "20G"]
    return flags + (["--quantization", "fp8"] if variant == "fp8" else [])


def stage_figures(con, run_id: str, classes: bool) -> dict:
    where = "" if classes else " AND class_name = '(all)'"
    rows = con.execute(f"SELECT level, class_name, requests, {', '.join(COLS)} FROM stage_summary "
                       f"WHERE run_id = ?{where} ORDER BY level, class_name", [run_id]).fetchall()
    return {(int(r[0]), r[1]): (r[2], dict(zip(COLS, r[3:]))) for r in rows}


def stored_profile(con, run: str, work: Path) -> Path | None:
    """The profile the run recorded (runs.profile_text), written out for ``servelab predict``."""
    row = con.execute("SELECT profile_text FROM runs WHERE run_id = ?", [run]).fetchone()
    if not row or not row[0]:
        return None
    path = work / f"{run}.yaml"
    path.write_text(row[0])
    return path


def profile_of(con, capture: Path, run: str, work: Path) -> Path | None:
    """The run's profile: ``<run>.yaml`` in the capture, else in bench/fidelity_workloads, else the
    one the run recorded (None: none of them)."""
    for path in (capture / f"{run}.yaml", WORKLOADS / f"{run}.yaml"):
        if path.exists():
            return path
    return stored_profile(con, run, work)


def write_variant(work: Path, variant: str, capture: Path) -> Path:
    """A variant file that serves the captured model with the captured server's engine flags."""
    spec = work / f"{variant}.yaml"
    cc = 8.9 if variant == "fp8" else 8.0
    weights, acts = CLAIMS.get(variant, (variant, variant))
    spec.write_text(f"name: {variant}\nmodel: {MODELS.get(variant, MODEL)}\n"
                    f"serve_args: {json.dumps(serve_args(capture, variant))}\n"
                    "description: the captured server's engine flags\n"
                    f"claims: {{weights: {weights}, activations: {acts}, "
                    f"speculative: null, min_compute_capability: {cc}}}\n")
    return spec


def predict_run(profile: Path, args, work: Path, capture: Path) -> dict:
    import duckdb

    from servelab.orchestration.predict import predict
    from servelab.specs.variants import load_variant

    spec = write_variant(work, args.variant, capture)
    db = work / f"{profile.stem}.duckdb"
    res = predict(load_variant(spec), args.hardware, profile, db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        return stage_figures(con, res.run_id, args.classes)
    finally:
        con.close()


def main(argv=None) -> int:
    args = _arguments(argv)
    import duckdb

    from servelab.sim.engine.costs import resolve_cost
    from servelab.specs.engine_config import build_engine_config

    work = Path(tempfile.mkdtemp(prefix="servelab-fidelity-capture-"))
    if args.defaults or args.calibration:
        caldir = work / "calibration"
        caldir.mkdir()
        if args.calibration:
            shutil.copy(args.calibration, caldir / args.calibration.name)
        os.environ["SERVELAB_CALIBRATION_DIR"] = str(caldir)
    db = args.capture / "capture.duckdb"
    con = (duckdb.connect(str(db), read_only=True) if db.exists()
           else open_export(args.capture))   # a capture kept in the repository
    runs = (args.runs.split(",") if args.runs else
            [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY started_unix").fetchall()])
    config = build_engine_config(args.hardware, MODELS.get(args.variant, MODEL),
                                 serve_args(args.capture, args.variant))
    print(f"{args.variant} on {args.hardware} ({' '.join(serve_args(args.capture, args.variant))}),"
          f" priced by {resolve_cost(config)[1]}")
    bad, cells = 0, 0
    for run in runs:
        profile = profile_of(con, args.capture, run, work)
        if profile is None:
            print(f"\n{run}: no profile ({run}.yaml in the capture or {WORKLOADS})")
            continue
        real = stage_figures(con, run, args.classes)
        pred = predict_run(profile, args, work, args.capture)
        run_bad, run_cells = print_comparison(run, real, pred)
        bad, cells = bad + run_bad, cells + run_cells
    print(f"\n(all) cells outside target: {bad} of {cells}")
    con.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _arguments(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture", type=Path)
    ap.add_argument("--runs", default=None, help="run ids (default: every run in capture.duckdb)")
    ap.add_argument("--variant", default="bf16")
    ap.add_argument("--hardware", default=HARDWARE)
    ap.add_argument("--classes", action="store_true")
    ap.add_argument("--defaults", action="store_true")
    ap.add_argument("--calibration", type=Path, default=None)
    return ap.parse_args(argv)


def print_comparison(run: str, real: dict, pred: dict) -> tuple[int, int]:
    """One run's measured and predicted figures and their ratios; of its (all) cells, how many
    are outside their target and how many there are."""
    bad = cells = 0
    print(f"\n{run}  (ratio = predicted/measured; * outside its target)")
    print(f"{'users':>5} {'class':<7} {'n':>4} {'':9}"
          + "".join(f"{SHORT[c]:>10}" for c in COLS))
    for key in sorted(real):
        n, m = real[key]
        p = pred.get(key, (0, {}))[1]
        ratios = []
        for c in COLS:
            mv, pv = m.get(c), p.get(c)
            if not mv or pv is None:
                ratios.append(f"{'-':>10}")
                continue
            ok = abs(pv / mv - 1) <= TARGETS[c]
            if key[1] == "(all)":
                cells += 1
                bad += not ok
            ratios.append(f"{pv / mv:9.2f}{' ' if ok else '*'}")
        fmt = lambda d: "".join(f"{d[c]:10.1f}" if d.get(c) is not None else f"{'-':>10}"
                                for c in COLS)  # noqa: E731
        print(f"{key[0]:>5} {key[1]:<7} {n:>4} measured " + fmt(m))
        print(f"{'':>18} predicted" + fmt(p))
        print(f"{'':>18} ratio    " + "".join(ratios))
    return bad, cells


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
