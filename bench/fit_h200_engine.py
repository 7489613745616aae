"""The engine's step coefficients of the H200 calibrations, fitted to the capture's iteration lines.

    python bench/fit_h200_engine.py [servers/captured/h200_20261202] [--variant bf16]
    python bench/fit_h200_engine.py --host-only --variant gptq_int4

vLLM 0.26 logs every engine step with ``--enable-logging-iteration-details`` (``Iteration(N)``:
context requests/tokens, generation requests/tokens, ``elapsed_ms``, KV usage). With async
scheduling ``elapsed_ms`` is only the wait on the step's result
(``EngineCore.step_with_batch_queue`` in vllm/v1/engine/core.py wraps ``future.result()`` in
``capture_iteration_details``), and the log stamps lines to the second. So the fit uses what
one logged second does say exactly: its steps ran back to back for one second when the engine
was never idle (every stage of 16 users and more), i.e. the sum of the simulator's step
periods, ``max(GPU, host)`` each (``sim.engine.pipeline``), over that second's logged shapes
should be 1 s. Each line's shape: its generation requests decode over the KV cache's tokens
(``kv_cache_usage_pct`` of the 374,480-token cache, less the step's prompt chunks), its context
tokens are prompt chunks split evenly over its context requests.

Fitted (least squares of log errors, a coordinate search: no SciPy here), to two things at once
(each weighted as one): the busy seconds' period sums (against 1 s) and the 1-user prefill spans
(an idle engine: host + GPU + ``t_idle_step_s``, + ``t_eager_step_s`` past the largest CUDA
graph, against each request's span): ``eta_compute`` (GEMM throughput), ``eta_attn`` (what grows
with a chunk's length), ``t_eager_step_s``, ``t_idle_step_s`` and, on the fp8-w8a8 path,
``fp8_m64_weight_extra`` (CUTLASS's slower 17-64-token tile, ``sim.engine.cost_model``). The
host terms are held at the decode-only seconds' 2.5 ms + 40 us per running request (``HOST``),
and ``eta_bw`` is set first by the 1-user decode step, which is weight streaming: the cost
model's decode step at the 1-user stage's mean context equals the measured TPOT p50.
It prints the fitted values and the mean period sum per stage before and after.

``t_host_prompt_token_s`` (sixth pass, ``host_input_prep``) is fitted after them, by least squares,
to the host work the same busy seconds record: a logged second's steps ran back to back, each
its host work then its ``elapsed_ms`` wait, so 1 s less the second's ``elapsed_ms`` is its host
work, priced with ``HOST`` and ``t_eager_step_s`` held plus this term per prompt token the steps
scheduled. It prints the recorded and modelled host work per step for each stage.
``--host-only`` fits that term alone, on the variant's calibration as it is: what the Int4
variants' own lines give (their files carry bf16's host terms; their GPU terms are
bench/fit_int4_kernel.py's).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "servers" / "captured" / "h200_20261202"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
FLAGS = {"bf16": ["--max-model-len", "4096", "--kv-cache-memory-bytes", "20G"],
         "fp8": ["--max-model-len", "4096", "--kv-cache-memory-bytes", "20G",
                 "--quantization", "fp8"]}
KV_TOKENS = 374_480        # "GPU KV cache size: 374,480 tokens" (each variant's startup.log)
FITTED = ("eta_compute", "eta_attn", "t_eager_step_s", "t_idle_step_s", "fp8_m64_weight_extra")
# The host side of a step, read off the capture's decode-only seconds (the step period there is
# the host floor once GPU time falls under it): 2.5 ms plus 40 us per running request.
HOST = {"t_host_s": 0.0025, "t_host_seq_s": 40e-6}
OPTIONAL = ("t_eager_step_s", "t_idle_step_s", "fp8_m64_weight_extra")  # may fit to 0: off
# Where the search starts a coefficient the calibration does not have yet (0 cannot be scaled);
# fp8_m64_weight_extra prices only the fp8-w8a8 kernel path, so a BF16 fit keeps it at 0.
START = {"t_idle_step_s": 0.005, "fp8_m64_weight_extra": 0.3}
CUDAGRAPH_MAX_TOKENS = 512   # a prefill past it launches without a CUDA graph (sim.engine.pipeline)


def _duckdb():
    import duckdb

    return duckdb.connect()


def measured_stages(con, capture: Path, variant: str):
    """(run folder, level, window start, window end) of every stage of 16 users or more."""
    for folder in sorted((capture / variant).iterdir()):
        if (folder / "stages.parquet").is_file():
            yield from ((folder, level, a, b) for level, a, b in con.execute(
                f"SELECT level, measure_start_unix, measure_end_unix FROM "
                f"'{folder / 'stages.parquet'}' WHERE level >= 16").fetchall())


def busy_seconds(capture: Path, variant: str) -> list[tuple[str, int, list[tuple]]]:
    """(run, level, [(ctx_reqs, ctx_tokens, gen_reqs, kv_pct)...]) for every whole log second
    inside a measured window of 16 users or more."""
    con, out = _duckdb(), []
    for folder, level, a, b in measured_stages(con, capture, variant):
        rows = con.execute(
            f"SELECT log_second_unix, context_requests, context_tokens, generation_requests, "
            f"kv_cache_usage_pct FROM '{folder / 'server_iterations.parquet'}' WHERE "
            f"log_second_unix >= ceil(?) AND log_second_unix < floor(?) ORDER BY line_no",
            [a, b]).fetchall()
        seconds: dict = {}
        for sec, *shape in rows:
            seconds.setdefault(sec, []).append(tuple(shape))
        out += [(folder.name, int(level), steps) for steps in seconds.values()]
    return out


def host_seconds(capture: Path, variant: str) -> list[tuple]:
    """(run, level, steps, running requests, prompt tokens, eager steps, host seconds) of every
    whole log second inside a measured window of 16 users or more."""
    con, out = _duckdb(), []
    for folder, level, a, b in measured_stages(con, capture, variant):
        out += [(folder.name, int(level)) + tuple(r[1:]) for r in con.execute(
            f"SELECT log_second_unix, count(*), sum(context_requests + generation_requests), "
            f"coalesce(sum(context_tokens), 0), count(*) FILTER (WHERE context_tokens + "
            f"generation_tokens > {CUDAGRAPH_MAX_TOKENS}), 1 - sum(elapsed_ms) / 1000 FROM "
            f"'{folder / 'server_iterations.parquet'}' WHERE log_second_unix >= ceil(?) AND "
            f"log_second_unix < floor(?) GROUP BY 1", [a, b]).fetchall()]
    return out


def modelled_host(params, steps: int, seqs: int, prompt: int, eager: int) -> float:
    return (params.t_host_s * steps + params.t_host_seq_s * seqs + params.t_eager_step_s * eager
            + params.t_host_prompt_token_s * prompt)


def fit_host_prompt(params, seconds) -> float:
    """Least squares of the recorded host seconds over the prompt tokens, the rest held."""
    held = replace(params, t_host_prompt_token_s=0.0)
    num = sum(p * (h - modelled_host(held, n, s, p, e)) for _, _, n, s, p, e, h in seconds)
    return max(0.0, num / sum(p * p for *_, p, _, _ in seconds))


def host_report(before, after, seconds) -> None:
    by_stage: dict = {}
    for run, level, *row in seconds:
        by_stage.setdefault((run, level), []).append(row)
    print(f"{'run':<14}{'users':>6}{'host ms/step':>13}{'before':>8}{'after':>8}"
          f"{'prompt tok/step':>16}")
    for (run, level), rows in sorted(by_stage.items()):
        n, s, p, e, h = (sum(r[i] for r in rows) for i in range(5))
        print(f"{run:<14}{level:>6}{1e3 * h / n:>13.2f}"
              f"{1e3 * modelled_host(before, n, s, p, e) / n:>8.2f}"
              f"{1e3 * modelled_host(after, n, s, p, e) / n:>8.2f}{p / n:>16.0f}")


def step_shape(ctx_reqs: int, ctx_tokens: int, gen_reqs: int, kv_pct: float):
    from servelab.sim.engine.cost_model import BatchShape

    shape = BatchShape()
    context = max(0, int(kv_pct / 100 * KV_TOKENS) - ctx_tokens)
    for i in range(gen_reqs):
        shape.add_decode(context // gen_reqs + (i < context % gen_reqs))
    for i in range(ctx_reqs):
        shape.add_prefill(ctx_tokens // ctx_reqs + (i < ctx_tokens % ctx_reqs), 0)
    return shape


def period_sums(config, params, seconds) -> list[float]:
    from servelab.sim.engine.cost_model import priced

    model = priced(config, params)
    sums = []
    for _, _, steps in seconds:
        total = 0.0
        for ctx_reqs, ctx_tokens, gen_reqs, kv in steps:
            shape = step_shape(ctx_reqs, ctx_tokens, gen_reqs, kv)
            host = (params.t_host_s + params.t_host_seq_s * shape.num_seqs
                    + params.t_host_prompt_token_s * shape.prefill_tokens)
            total += max(model.step_time(shape), host)
        sums.append(total)
    return sums


def idle_spans(capture: Path, variant: str) -> list[tuple[int, float]]:
    """(prompt tokens, prefill span ms) of every request sent in a 1-user stage (its warm-up
    too): the engine was idle when each arrived, so its span is host + GPU of one step."""
    import duckdb

    con = duckdb.connect()
    out = []
    for folder in sorted((capture / variant).iterdir()):
        if not (folder / "stages.parquet").is_file():
            continue
        out += con.execute(
            f"SELECT s.prompt_tokens, s.time_in_model_prefill_s * 1000 FROM "
            f"'{folder / 'server_spans.parquet'}' s JOIN '{folder / 'stages.parquet'}' st "
            f"ON s.start_unix BETWEEN st.started_unix AND st.measure_end_unix "
            f"WHERE st.level = 1 AND s.time_in_model_prefill_s > 0").fetchall()
    return out


def idle_prefill_ms(model, params, tokens: int) -> float:
    """An idle engine's prefill: nothing to overlap the host side with (``sim.engine.pipeline``)."""
    from servelab.sim.engine.cost_model import BatchShape

    shape = BatchShape()
    shape.add_prefill(tokens, 0)
    host = params.t_host_s + params.t_host_seq_s + params.t_idle_step_s
    if tokens > CUDAGRAPH_MAX_TOKENS:
        host += params.t_eager_step_s
    return 1e3 * (model.step_time(shape) + host)


def loss(config, params, seconds, spans=()) -> float:
    """Mean squared log error of the busy seconds' period sums (against 1 s) plus that of the
    idle prefills (against their spans), each part weighted as one."""
    from servelab.sim.engine.cost_model import priced

    busy = sum(math.log(s) ** 2 for s in period_sums(config, params, seconds)) / len(seconds)
    if not spans:
        return busy
    model = priced(config, params)
    idle = sum(math.log(idle_prefill_ms(model, params, n) / ms) ** 2 for n, ms in spans)
    return busy + idle / len(spans)


def fit_bw(config, params, tpot_ms: float, context: int):
    """eta_bw such that one decode step at ``context`` tokens takes ``tpot_ms``."""
    from servelab.sim.engine.cost_model import BatchShape, priced

    shape = BatchShape()
    shape.add_decode(context)
    lo, hi = 0.3, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        ms = 1e3 * priced(config, replace(params, eta_bw=mid)).step_time(shape)
        lo, hi = (mid, hi) if ms > tpot_ms else (lo, mid)
    return replace(params, eta_bw=round((lo + hi) / 2, 4))


def coordinate_search(config, params, seconds, spans, rounds: int = 4):
    for _ in range(rounds):
        for name in FITTED:
            best = (loss(config, params, seconds, spans), getattr(params, name))
            for factor in (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.4, 2.0):
                value = getattr(params, name) * factor
                if (name.startswith("eta_") and not 0 < value <= 1) or (
                        value == 0 and name not in OPTIONAL):
                    continue
                trial = loss(config, replace(params, **{name: value}), seconds, spans)
                if trial < best[0]:
                    best = (trial, value)
            params = replace(params, **{name: float(f"{best[1]:.4g}")})
    return params


def one_user_tpot(capture: Path, variant: str) -> tuple[float, int]:
    import csv

    with open(capture / variant / f"phases_{variant}" / "stage_summary.csv") as f:
        row = next(r for r in csv.DictReader(f)
                   if r["class_name"] == "(all)" and float(r["level"]) == 1.0)
    context = float(row["prompt_tokens_mean"]) + float(row["output_tokens_mean"]) / 2
    return float(row["tpot_p50_ms"]), int(context)


def fit(capture: Path, variant: str):
    """The fitted coefficients (a CostParams) and the seconds they were fitted on."""
    from servelab.sim.engine.costs import resolve_cost
    from servelab.specs.engine_config import build_engine_config

    config = build_engine_config("H200", MODEL, FLAGS[variant])
    params = resolve_cost(config)[0]
    seconds = busy_seconds(capture, variant)
    params = fit_bw(config, params, *one_user_tpot(capture, variant))
    start = {k: getattr(params, k) or v for k, v in START.items()
             if k != "fp8_m64_weight_extra" or config.quant.name == "fp8-w8a8"}
    params = replace(params, **start, **HOST)
    spans = idle_spans(capture, variant)
    params = coordinate_search(config, params, seconds, spans)
    host = host_seconds(capture, variant)
    params = replace(params, t_host_prompt_token_s=float(f"{fit_host_prompt(params, host):.3g}"))
    return config, params, seconds, host


def report(config, before, after, seconds) -> None:
    by_stage: dict = {}
    for (run, level, _), b, a in zip(seconds, period_sums(config, before, seconds),
                                     period_sums(config, after, seconds)):
        by_stage.setdefault((run, level), []).append((b, a))
    print(f"{'run':<14}{'users':>6}{'seconds':>8}{'sum before':>12}{'sum after':>11}")
    for (run, level), pairs in sorted(by_stage.items()):
        n = len(pairs)
        print(f"{run:<14}{level:>6}{n:>8}{sum(p[0] for p in pairs) / n:>12.3f}"
              f"{sum(p[1] for p in pairs) / n:>11.3f}")


def host_only(capture: Path, variant: str) -> int:
    from servelab.specs.cost_calibration import calibrations

    before = next(c.params for c in calibrations()
                  if c.hardware == "H200" and c.variant == variant)
    host = host_seconds(capture, variant)
    after = replace(before, t_host_prompt_token_s=float(f"{fit_host_prompt(before, host):.3g}"))
    print(f"{variant}: {len(host)} busy log seconds")
    print(f"  t_host_prompt_token_s: {before.t_host_prompt_token_s} -> "
          f"{after.t_host_prompt_token_s}")
    host_report(before, after, host)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture", nargs="?", type=Path, default=CAPTURE)
    ap.add_argument("--variant", default="bf16",
                    choices=sorted(FLAGS) + ["gptq_int4", "awq_int4"])
    ap.add_argument("--host-only", action="store_true",
                    help="fit t_host_prompt_token_s alone on the variant's calibration")
    args = ap.parse_args(argv)
    from servelab.sim.engine.costs import resolve_cost

    if args.host_only:
        return host_only(args.capture, args.variant)
    if args.variant not in FLAGS:
        ap.error(f"--variant {args.variant}: its GPU terms are bench/fit_int4_kernel.py's; "
                 f"use --host-only")

    config, params, seconds, host = fit(args.capture, args.variant)
    before = resolve_cost(config)[0]
    print(f"{args.variant}: {len(seconds)} busy log seconds")
    for name in ("eta_bw",) + FITTED + tuple(HOST) + ("t_host_prompt_token_s",):
        print(f"  {name}: {getattr(before, name)} -> {getattr(params, name)}")
    report(config, before, params, seconds)
    host_report(before, params, host)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
