#!/usr/bin/env python
"""Does the simulator, calibrated from probes alone, predict what a real GPU measured?

For every variant with a probe calibration in ``servers/calibration/`` and a captured ``vllm bench
serve`` sweep in ``servers/captured/bench/<variant>/c<N>.json`` (H200, vLLM 0.26, random dataset,
1,024 prompt tokens, 256 output tokens, ``--ignore-eos``, ``--request-rate inf``,
``--max-concurrency N``), the same sweep is replayed in virtual time: the same number of prompts
of random tokens, all released at t=0 through a cap of N in flight, as bench serve's semaphore
does, on the captured server's own flags. It prints each figure predicted / measured with the
ratio, the targets of issue 13 (TTFT p50, TPOT p50 and output tokens/s within 15%, ITL p99 within
25%) and, per level, the winner each side names between the variants.

A second table does the same for servelab's own closed-loop runs on those servers
(``servers/captured/<variant>/servelab_stage_figures.csv``: 1, 16 and 64 users, 5 s warm-up, a
20 s measured window each, the profile ``servers/captured/session/scripts/fixed_1024_256.yaml``):
``servelab predict`` of that profile, stage figures from the same ``stage_summary`` view.

Figures: measured = vLLM's client or servelab's (exact over their requests); predicted = the
virtual run (exact over its requests, one seed). The calibration files say how they were fitted.

Usage: python bench/fidelity_gpu.py [--variants bf16,fp8] [--defaults] [--no-closed-loop]
  --defaults: the built-in coefficients instead of the calibration (what the issue measured)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAPTURED = ROOT / "servers/captured"
FLAGS = {"bf16": ["--max-model-len", "4096"],
         "fp8": ["--max-model-len", "4096", "--quantization", "fp8"]}
MODEL, HARDWARE = "Qwen/Qwen2.5-7B-Instruct", "H200"
TARGETS = {"ttft_p50": 0.15, "tpot_p50": 0.15, "tok_s": 0.15, "itl_p99": 0.25}


def measured(variant: str, level: int) -> dict | None:
    path = CAPTURED / "bench" / variant / f"c{level}.json"
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    return {"requests": d["completed"], "ttft_p50": d["median_ttft_ms"], "ttft_p99": d["p99_ttft_ms"],
            "tpot_p50": d["median_tpot_ms"], "itl_p99": d["p99_itl_ms"],
            "tok_s": d["output_throughput"]}


def predicted(variant: str, level: int, requests: int, seed: int = 0) -> dict:
    """The sweep level in virtual time, priced as resolve_cost decides (a matching calibration
    in $SERVELAB_CALIBRATION_DIR or servers/calibration, else the built-in coefficients)."""
    from servelab.core.quantiles import quantile_cont
    from servelab.sim.engine.balancer import make_engines
    from servelab.sim.engine.virtual import InFlightCap, VirtualRequest, VirtualRunner
    from servelab.specs.engine_config import build_engine_config

    config = build_engine_config(HARDWARE, MODEL, FLAGS[variant])
    runner = VirtualRunner(make_engines(config, seed), sample_interval_s=0)
    rng = random.Random(1000 + level)
    cap = InFlightCap(level)
    for i in range(requests):
        ids = [rng.randrange(100, 150000) for _ in range(1024)]
        runner.submit(VirtualRequest(1024, 256, prompt_token_ids=ids, request_id=f"r{i}"), 0.0, cap)
    res = runner.run()
    recs = [r for r in res.records if r.end_s is not None]
    itl = [g for r in recs for g in r.itls]
    # quantile_cont is numpy's linear percentile, which vllm bench serve reports too.
    return {"requests": len(recs), "ttft_p50": 1e3 * statistics.median(r.ttft for r in recs),
            "ttft_p99": 1e3 * quantile_cont((r.ttft for r in recs), 0.99),
            "tpot_p50": 1e3 * statistics.median(r.tpot for r in recs),
            "itl_p99": 1e3 * quantile_cont(itl, 0.99),
            "tok_s": sum(r.output_tokens for r in recs) / max(r.end_s for r in recs)}


def closed_loop(variant: str, work: Path) -> list[tuple[int, dict, dict]]:
    """``servelab predict`` of the captured closed-loop profile against servelab's captured run."""
    import csv

    import duckdb

    from servelab.orchestration.predict import predict
    from servelab.specs.variants import load_variant

    figures = CAPTURED / variant / "servelab_stage_figures.csv"
    if not figures.exists():
        return []
    spec = work / f"{variant}.yaml"
    spec.write_text(f"name: {variant}\nmodel: {MODEL}\nserve_args: {json.dumps(FLAGS[variant])}\n"
                    "description: as captured on the H200 (servers/captured/README.md)\n"
                    f"claims: {{weights: {variant}, activations: {variant}, speculative: null, "
                    f"min_compute_capability: {8.9 if variant == 'fp8' else 8.0}}}\n")
    db = work / f"{variant}.duckdb"
    predict(load_variant(spec), HARDWARE, CAPTURED / "session/scripts/fixed_1024_256.yaml", db)
    con = duckdb.connect(str(db), read_only=True)   # predict installed the views
    pred = {int(r[0]): dict(zip(("ttft_p50", "ttft_p99", "tpot_p50", "itl_p99", "tok_s"), r[1:]))
            for r in con.execute("SELECT level, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, itl_p99_ms, "
                                 "output_tokens_per_s FROM stage_summary WHERE class_name = '(all)'"
                                 ).fetchall()}
    con.close()
    out = []
    for row in csv.DictReader(figures.open()):
        level = int(float(row["level"]))
        real = {"ttft_p50": float(row["ttft_p50_ms"]), "ttft_p99": float(row["ttft_p99_ms"]),
                "tpot_p50": float(row["tpot_p50_ms"]), "itl_p99": float(row["itl_p99_ms"]),
                "tok_s": float(row["output_tokens_per_s"]), "requests": int(row["requests"])}
        if level in pred:
            out.append((level, pred[level], real))
    return out


def cost_label(variant: str) -> str:
    from servelab.sim.engine.costs import resolve_cost
    from servelab.specs.engine_config import build_engine_config

    return resolve_cost(build_engine_config(HARDWARE, MODEL, FLAGS[variant]))[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="bf16,fp8")
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--defaults", action="store_true")
    ap.add_argument("--no-closed-loop", action="store_true", help="only the vllm bench serve sweep")
    args = ap.parse_args(argv)
    if args.defaults:   # no calibration applies: resolve_cost gives the built-in coefficients
        os.environ["SERVELAB_CALIBRATION_DIR"] = str(Path(tempfile.mkdtemp()) / "none")
    variants = args.variants.split(",")
    levels = [int(x) for x in args.levels.split(",")]
    cols = ["ttft_p50", "ttft_p99", "tpot_p50", "itl_p99", "tok_s"]
    rows, tally = {}, [0, 0]

    def line(level: int, n: int, p: dict, m: dict) -> None:
        # Three short lines per level keep the table inside 80 columns.
        ratios = []
        for k in cols:
            ratio = p[k] / m[k]
            ok = k not in TARGETS or abs(ratio - 1) <= TARGETS[k]
            tally[0] += k in TARGETS and not ok
            tally[1] += k in TARGETS
            ratios.append(f"{ratio:9.2f}{' ' if ok else '*'}")
        print(f"{level:>5} {n:>5}  measured " + "".join(f"{m[k]:9.1f} " for k in cols))
        print(f"{'':>11}  predicted" + "".join(f"{p[k]:9.1f} " for k in cols))
        print(f"{'':>11}  ratio    " + "".join(ratios))

    head = f"{'level':>5} {'n':>5}  {'':9}" + "".join(f"{c:>10}" for c in cols) + "\n" + "-" * 70
    for v in variants:
        label = cost_label(v).replace(" (", "\n  (", 1)   # two lines: inside 80 columns
        print(f"\n{v} on {HARDWARE}, vllm bench serve sweep, priced by\n  {label}")
        print(head)
        for c in levels:
            m = measured(v, c)
            if m is None:
                print(f"{c:>5}  no capture")
                continue
            p = predicted(v, c, m["requests"])
            rows[v, c] = (p, m)
            line(c, m["requests"], p, m)
    print(f"\n* outside its target: {tally[0]} of {tally[1]} cells\n  (targets: "
          f"{', '.join(f'{k} {t:.0%}' for k, t in TARGETS.items())})")
    if not args.no_closed_loop:
        tally[:] = [0, 0]
        with tempfile.TemporaryDirectory(prefix="servelab-fidelity-gpu-") as tmp:
            for v in variants:
                print(f"\n{v}, servelab closed loop (measured windows; n = measured requests)")
                print(head)
                for level, p, m in closed_loop(v, Path(tmp)):
                    line(level, m["requests"], p, m)
        print(f"\n* outside its target: {tally[0]} of {tally[1]} cells")
    if len(variants) == 2:
        print_winners(*variants, levels, rows)
    return 0


def print_winners(a: str, b: str, levels: list[int], rows: dict) -> None:
    """Per level, which of two variants wins each figure, predicted | measured."""
    print(f"\nwinner per level, predicted | measured ({a} vs {b}):")
    for c in levels:
        if (a, c) not in rows or (b, c) not in rows:
            continue
        (pa, ma), (pb, mb) = rows[a, c], rows[b, c]
        say = []
        for k, better in (("ttft_p50", min), ("tpot_p50", min), ("tok_s", max)):
            wp = a if better(pa[k], pb[k]) == pa[k] else b
            wm = a if better(ma[k], mb[k]) == ma[k] else b
            say.append(f"{k} {wp} | {wm}{'' if wp == wm else ' (differs)'}")
        print(f"  c={c:<4} " + "; ".join(say))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
