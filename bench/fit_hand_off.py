#!/usr/bin/env python
"""Fit the API server's load-dependent hand-off (issue 22, third pass) to the recorded spans.

    python bench/fit_hand_off.py [--variants bf16,fp8] [--coef api_busy_full_load]
        [--values 0.2,0.35,0.5] [--set api_prompt_token_s=8.6e-6,api_busy_prompt_token_s=0]

Measured, per run and load level of servers/captured/h200_20261202/<variant>/: the client's send
to the engine's queue, as the spans split TTFT (``phase_stage_summary.csv``: *to server* +
*server other*, medians; "server other" is the server's TTFT less its queue and prefill, i.e.
the hand-off to the engine core and the first token's way back). Predicted: ``servelab
predict`` of the same profile on the captured flags (``fidelity_capture``), each request's send
to its hand-off (the ``arrival_time`` the API server's model gives ``Engine.add_request``),
median per stage. For each candidate value of
the coefficient (written into a copy of the variant's calibration) it prints predicted /
measured per level and the rms of log(predicted / measured) over the levels of 16 users and up
(the 1-user hand-off is the idle coefficients' own fit: tests/sim_engine/test_capture_gaps.py).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import fidelity_capture as fc  # noqa: E402  (a sibling script, not a package)

CAPTURE = ROOT / "servers" / "captured" / "h200_20261202"
CALIBRATIONS = ROOT / "servers" / "calibration"


def measured(capture: Path, run: str) -> dict[int, float]:
    """Per level: median client send -> engine queue (to server + server other), ms."""
    rows = csv.DictReader(open(capture / run / "phase_stage_summary.csv"))
    return {int(float(r["level"])): float(r["to_server_p50_ms"]) + float(r["server_other_p50_ms"])
            for r in rows}


def calibration_copy(variant: str, values: dict[str, float], work: Path) -> Path:
    """A folder holding the variant's calibration with each coefficient of ``values`` set."""
    src = next(p for p in CALIBRATIONS.glob("H200-*.yaml")
               if re.search(rf"^variant: {variant}$", p.read_text(), re.M))
    text = src.read_text()
    for coef, value in values.items():
        line = f"  {coef}: {value:.4e}"   # YAML 1.1 reads a float only with a dot and a sign
        if re.search(rf"^  {coef}: ", text, re.M):
            text = re.sub(rf"^  {coef}: .*$", line, text, count=1, flags=re.M)
        else:
            text = text.replace("params:\n", f"params:\n{line}\n", 1)
    folder = Path(tempfile.mkdtemp(prefix=f"cal-{variant}-", dir=work))
    (folder / src.name).write_text(text)
    return folder


@contextmanager
def hand_off_times():
    """Every request's hand-off to an engine meanwhile, by request id (virtual seconds)."""
    from servelab.sim.engine.engine import Engine

    times: dict[str, float] = {}
    add = Engine.add_request

    def logged(self, request_id, *args, **kwargs):
        times[request_id] = kwargs.get("arrival_time", 0.0)
        return add(self, request_id, *args, **kwargs)
    Engine.add_request = logged
    try:
        yield times
    finally:
        Engine.add_request = add


def predicted(variant: str, run: str, capture: Path, work: Path) -> dict[int, float]:
    """Per level: the model's median send -> hand-off over the measured window's requests, ms."""
    from servelab.orchestration.predict import Predictor
    from servelab.sim.engine.virtual_stages import in_warmup, stage_at
    from servelab.specs.variants import load_variant

    con = fc.open_export(capture)
    try:
        profile = fc.profile_of(con, capture, run, work)
    finally:
        con.close()
    if profile is None:
        raise SystemExit(f"{run}: no profile ({run}.yaml in {capture} or {fc.WORKLOADS}, or "
                         "recorded by the run)")
    pred = Predictor(load_variant(fc.write_variant(work, variant, capture)), "H200", profile, None)
    with hand_off_times() as handed:
        result, windows = pred.run()
    waits: dict[int, list[float]] = {}
    for rec in result.records:
        win = stage_at(windows, rec.sent_s)
        if rec.request_id not in handed or in_warmup(win, rec.sent_s):
            continue
        level = int(pred.stages[win.stage].level)
        waits.setdefault(level, []).append(1e3 * (handed[rec.request_id] - rec.sent_s))
    return {lvl: statistics.median(v) for lvl, v in waits.items()}


def runs_of(variant: str) -> list[str]:
    return [p.name for p in sorted((CAPTURE / variant).iterdir())
            if (p / "phase_stage_summary.csv").exists()]


def fit_one(variants: list[str], values: dict[str, float], work: Path) -> float:
    """Print predicted / measured per level for one setting; the rms log error over the levels
    of 16 users and up (and, printed, over all levels)."""
    errs, every = [], []
    for variant in variants:
        os.environ["SERVELAB_CALIBRATION_DIR"] = str(calibration_copy(variant, values, work))
        for run in runs_of(variant):
            real = measured(CAPTURE / variant, run)
            pred = predicted(variant, run, CAPTURE / variant, work)
            cells = []
            for lvl in sorted(real):
                if lvl in pred:
                    cells.append(f"{lvl}: {pred[lvl]:.0f}/{real[lvl]:.0f}")
                    every.append(math.log(pred[lvl] / real[lvl]))
                    if lvl >= 16:
                        errs.append(every[-1])
            print(f"  {variant:9} {run:17} " + "  ".join(cells))
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    rms_all = math.sqrt(sum(e * e for e in every) / len(every))
    print(f"{values}: rms log(predicted/measured) {rms:.3f} over {len(errs)} levels >= 16 users, "
          f"{rms_all:.3f} over all {len(every)}\n")
    return rms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="bf16,fp8")
    ap.add_argument("--coef", default="api_busy_full_load")
    ap.add_argument("--values", default="0.2,0.25,0.3,0.35,0.4,0.5")
    ap.add_argument("--set", default="", help="more coefficients, fixed: name=value,...")
    args = ap.parse_args(argv)
    fixed = {k: float(v) for k, v in (kv.split("=") for kv in args.set.split(",") if kv)}
    work = Path(tempfile.mkdtemp(prefix="servelab-fit-hand-off-"))
    print("send -> hand-off, predicted/measured ms per level (measured: to server + server other)")
    fits = {float(v): fit_one(args.variants.split(","), {**fixed, args.coef: float(v)}, work)
            for v in args.values.split(",")}
    best = min(fits, key=fits.get)
    print(f"best {args.coef} = {best:g} (rms {fits[best]:.3f})")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
