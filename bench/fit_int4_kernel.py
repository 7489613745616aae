"""The simulator's Machete kernel efficiencies (W4A16 on Hopper), fitted to the H200 capture.

    python bench/fit_int4_kernel.py [servers/captured/h200_20261202]

vLLM 0.26 runs a GPTQ or AWQ 4-bit checkpoint's linear layers through MacheteLinearKernel on
compute capability 9.0 (``specs.engine_config.w4a16_kernels``); the simulator prices that path
``w4a16-machete`` with ``sim.engine.costs.KERNEL_EFFICIENCY``: ``bw`` scales the weight-streaming
bandwidth of the quantized layers, ``gemm`` their tensor throughput, both against cuBLAS BF16
under the coefficients the Int4 configuration is priced with (``resolve_cost``: today the
built-in defaults, since servers/calibration has no H200 Int4 file). Each is fitted where it alone
sets the step time, on the cost model itself (no scheduler, no API server):

- ``bw``: one decode step at one user is weight streaming; the fit makes the cost model's step
  (one request at the stage's mean prompt plus half its mean reply as context) equal the measured
  TPOT p50 of the 1-user stage (``phases_*/stage_summary.csv``), GPTQ and AWQ together (the mean
  log error is zero).
- ``gemm``: an idle engine's prefill of 368-2,000 tokens is compute-bound; a fit makes the cost
  model's prefill step follow the server's own prefill time (``server_spans.parquet``,
  ``time_in_model_prefill_s`` of the 1-user stage's requests) against prompt length: least squares
  with a free constant, since the span also holds a fixed part (async scheduling, the sampler,
  the output's hop) that is not the GEMMs'. The same fit on the BF16 server's spans gives BF16's
  own factor, and ``gemm`` is the ratio of the two: Int4's compute priced relative to BF16's as
  measured, whatever the coefficients' ``eta_compute`` is for each.

It prints the fit; the numbers in ``KERNEL_EFFICIENCY`` are these rounded to two decimals
(tests/sim_engine/test_int4_h200.py re-runs the fit and holds the table to it).
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "servers" / "captured" / "h200_20261202"
PATH = "w4a16-machete"
# The checkpoints whose config the dummy folders carry (their quantization_config decides the
# kernel; the weights were random): what servers/variants/{gptq,awq}_int4.yaml serve.
MODELS = {"gptq_int4": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
          "awq_int4": "Qwen/Qwen2.5-7B-Instruct-AWQ"}
BF16_MODEL = "Qwen/Qwen2.5-7B-Instruct"   # the bf16 folder: the same model unquantized
FLAGS = ["--max-model-len", "4096", "--kv-cache-memory-bytes", "20G"]   # each cmd.txt's


def one_user(capture: Path, variant: str) -> dict:
    """The 1-user stage's (all) row of the phases run's stage_summary.csv, as numbers."""
    with open(capture / variant / f"phases_{variant}" / "stage_summary.csv") as f:
        row = next(r for r in csv.DictReader(f)
                   if r["class_name"] == "(all)" and float(r["level"]) == 1.0)
    return {k: float(v) for k, v in row.items() if k in (
        "tpot_p50_ms", "prompt_tokens_mean", "output_tokens_mean", "output_tokens_per_s")}


def prefill_spans(capture: Path, variant: str) -> list[tuple[int, float]]:
    """(prompt tokens, server-side prefill ms) of each request of the 1-user stage's window."""
    import duckdb

    folder = capture / variant / f"phases_{variant}"
    return duckdb.connect().execute(
        f"SELECT s.prompt_tokens, s.time_in_model_prefill_s * 1000 "
        f"FROM '{folder / 'server_spans.parquet'}' s JOIN '{folder / 'stages.parquet'}' st "
        f"ON s.run_id = st.run_id AND s.start_unix BETWEEN st.measure_start_unix "
        f"AND st.measure_end_unix WHERE st.stage = 0 AND s.time_in_model_prefill_s > 0 "
        f"ORDER BY 1").fetchall()


def step_ms(config, gemm: float, bw: float, *, decode_context: int = 0,
            prefill_tokens: int = 0) -> float:
    """One step of ``config`` with its kernel path's entry set to (gemm, bw), in ms."""
    from servelab.sim.engine import costs
    from servelab.sim.engine.cost_model import BatchShape, priced

    path = config.quant.name
    saved = costs.KERNEL_EFFICIENCY.get(path)
    costs.KERNEL_EFFICIENCY[path] = costs.KernelEfficiency(gemm, bw)
    try:
        model = priced(config, costs.resolve_cost(config)[0])
    finally:
        if saved is None:
            del costs.KERNEL_EFFICIENCY[path]
        else:
            costs.KERNEL_EFFICIENCY[path] = saved
    batch = BatchShape()
    if decode_context:
        batch.add_decode(decode_context)
    if prefill_tokens:
        batch.add_prefill(prefill_tokens, 0)
    return model.step_time(batch) * 1000


def _bisect(f, lo: float, hi: float, steps: int = 50) -> float:
    """The root of ``f`` (decreasing on [lo, hi])."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def fit_bw(configs: dict, stages: dict) -> float:
    def mean_log_error(bw: float) -> float:
        errs = [math.log(step_ms(configs[v], 1.0, bw, decode_context=round(
            s["prompt_tokens_mean"] + s["output_tokens_mean"] / 2)) / s["tpot_p50_ms"])
            for v, s in stages.items()]
        return sum(errs) / len(errs)
    return _bisect(mean_log_error, 0.05, 2.0)


def fit_gemm(configs: dict, spans: dict) -> float:
    """The compute efficiency that makes ``configs``' prefill steps follow the measured ones:
    least squares of measured = model + c over all variants' prefills (c: the fixed part)."""
    points = [(configs[v], n, ms) for v, rows in spans.items() for n, ms in rows]

    def sse(gemm: float) -> float:
        res = [ms - step_ms(cfg, gemm, 1.0, prefill_tokens=n) for cfg, n, ms in points]
        c = sum(res) / len(res)
        return sum((r - c) ** 2 for r in res)
    lo, hi = 0.2, 3.0   # golden-section search: the error is unimodal in gemm
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if sse(a) < sse(b) else (a, hi)
    return (lo + hi) / 2


def fit(capture: Path = CAPTURE) -> dict:
    from servelab.specs.engine_config import build_engine_config

    from servelab.sim.engine.costs import KERNEL_EFFICIENCY, resolve_cost

    configs = {v: build_engine_config("H200", m, FLAGS) for v, m in MODELS.items()}
    for v, c in configs.items():
        if c.quant.name != PATH:
            raise SystemExit(f"{v}: the simulator picks {c.quant.name} on the H200, not {PATH}")
    stages = {v: one_user(capture, v) for v in MODELS}
    spans = {v: prefill_spans(capture, v) for v in MODELS}
    # gemm relative to BF16's prefill on the same GPU, fitted alike: the constant share of the
    # spans and whatever the coefficients' eta_compute misses cancel, and the two precisions
    # keep the measured ratio of their compute rates (what sets throughput under load).
    bf16 = {"bf16": build_engine_config("H200", BF16_MODEL, FLAGS)}
    int4_abs = fit_gemm(configs, spans)
    bf16_abs = fit_gemm(bf16, {"bf16": prefill_spans(capture, "bf16")})
    gemm = int4_abs / bf16_abs * KERNEL_EFFICIENCY["bf16"].gemm
    return {"gemm": gemm, "bw": fit_bw(configs, stages), "int4_abs": int4_abs,
            "bf16_abs": bf16_abs, "priced_with": resolve_cost(configs["gptq_int4"])[1],
            "bf16_priced_with": resolve_cost(bf16["bf16"])[1],
            "configs": configs, "stages": stages, "spans": spans}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = fit(Path(argv[0]) if argv else CAPTURE)
    gemm, bw = result["gemm"], result["bw"]
    print(f"{PATH}: KernelEfficiency({gemm:.2f}, {bw:.2f})  (gemm {gemm:.4f}, bw {bw:.4f})")
    print(f"  Int4 priced with {result['priced_with']}; prefill fit alone: gemm "
          f"{result['int4_abs']:.3f}; BF16's alike ({result['bf16_priced_with']}): "
          f"{result['bf16_abs']:.3f}")
    for v, s in result["stages"].items():
        cfg = result["configs"][v]
        step = step_ms(cfg, gemm, bw, decode_context=round(
            s["prompt_tokens_mean"] + s["output_tokens_mean"] / 2))
        n = len(result["spans"][v])
        print(f"  {v}: 1-user decode step {step:.2f} ms vs TPOT p50 {s['tpot_p50_ms']:.2f} ms; "
              f"{n} prefills fitted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
