"""The simulator's defaults against published vLLM measurements (docs/simulator.md prints
this table): a benchmark of the engine, not part of it; ``servelab calibrate``
(``orchestration.calibrate``) fits coefficients to probes of a live server instead.

``python -m servelab.orchestration.calibrate_published`` reruns every comparison in virtual time.

Workload assumption for "chatbot-short" (the source does not publish its lengths): closed loop,
no think time, prompts uniform in 256..1024 tokens and outputs uniform in 16..112 tokens
(short chat turns: ShareGPT-like prompts, short answers), ``ignore_eos``. It is the simplest
workload whose concurrency-4 and concurrency-16 TTFT/TPOT/throughput fit the published triples
together (see the doc for the arithmetic).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from servelab.core.quantiles import quantile_cont
from servelab.sim.engine.balancer import make_engines
from servelab.sim.engine.virtual import VirtualRequest
from servelab.sim.engine.virtual_users import run_closed_loop, run_open_loop
from servelab.specs.engine_config import build_engine_config

CHATBOT_SHORT_PROMPT = (256, 1024)
CHATBOT_SHORT_OUTPUT = (16, 112)
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"

# https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/ (H100 80GB HBM3, vLLM 0.21.0, BF16):
# concurrency -> (output tok/s, TPOT p50 ms, TTFT p50 ms)
H100_SWEEP = {1: (122, 6.48, 14.0), 4: (580, 6.59, 22.8), 16: (1384, 10.94, 41.7), 64: (1312, 46.91, 86.9)}
# LambdaLabsML/vllm-benchmark benchmark_v0.md (vLLM 0.5.4, Llama-3.1-8B FP8, 320 prompts at once):
# gpu -> ((TP1 tok/s, TP1 TPOT ms), (TP2 tok/s, TP2 TPOT ms))
LAMBDA_TP = {"H100": ((3400, 19.75), (3689, 18.83)), "A100-80G": ((1518, 42.85), (1854, 38.21))}


@dataclass
class Row:
    case: str
    metric: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def chatbot_short(seed: int = 0):
    rng = random.Random(seed)

    def make(i: int) -> VirtualRequest:
        return VirtualRequest(prompt_len=rng.randint(*CHATBOT_SHORT_PROMPT),
                              output_len=rng.randint(*CHATBOT_SHORT_OUTPUT))
    return make


def h100_sweep(concurrencies=(1, 4, 16, 64), duration_s: float = 60.0, warmup_s: float = 10.0,
               seed: int = 0, config=None) -> list[Row]:
    cfg = config or build_engine_config("H100", LLAMA, ["--max-model-len", "8192"])
    rows = []
    for c in concurrencies:
        res = run_closed_loop(make_engines(cfg, seed), c, chatbot_short(seed), duration_s=duration_s)
        fin = res.finished(warmup_s, duration_s)
        thr, tpot_ms, ttft_ms = H100_SWEEP[c]
        case = f"H100 Llama-3.1-8B BF16, concurrency {c}"
        rows.append(Row(case, "output tok/s", res.output_throughput(warmup_s, duration_s), thr))
        rows.append(Row(case, "TPOT p50 ms", quantile_cont((r.tpot for r in fin), 0.5) * 1e3, tpot_ms))
        rows.append(Row(case, "TTFT p50 ms", quantile_cont((r.ttft for r in fin), 0.5) * 1e3, ttft_ms))
    return rows


def lambda_tp(seed: int = 0) -> list[Row]:
    """320 ShareGPT-like requests sent at once (lognormal lengths, means ~200 in / ~180 out)."""
    rows = []
    for gpu, measured in LAMBDA_TP.items():
        results = []
        for tp in (1, 2):
            cfg = build_engine_config(gpu, LLAMA, ["--quantization", "fp8", "--max-model-len", "8192",
                                                   "-tp", str(tp), "--max-num-seqs", "256"])
            rng = random.Random(seed)
            reqs = [VirtualRequest(prompt_len=max(4, int(rng.lognormvariate(5.0, 0.8))),
                                   output_len=max(4, int(rng.lognormvariate(4.9, 0.8)))) for _ in range(320)]
            res = run_open_loop(make_engines(cfg, seed), reqs)
            thr = sum(r.output_tokens for r in res.records) / res.end_s
            results.append((thr, quantile_cont((r.tpot for r in res.records), 0.5) * 1e3))
        for tp, (pred, meas) in enumerate(zip(results, measured), start=1):
            rows.append(Row(f"Lambda {gpu} Llama-3.1-8B FP8, TP{tp}", "output tok/s", pred[0], meas[0]))
            rows.append(Row(f"Lambda {gpu} Llama-3.1-8B FP8, TP{tp}", "TPOT p50 ms", pred[1], meas[1]))
        rows.append(Row(f"Lambda {gpu} FP8", "TP2/TP1 throughput", results[1][0] / results[0][0],
                        measured[1][0] / measured[0][0]))
    return rows


def format_table(rows: list[Row]) -> str:
    lines = ["| Case | Metric | Predicted | Measured | Error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.metric} | {r.predicted:.2f} | {r.measured:.2f} | {r.error:+.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(h100_sweep() + lambda_tp()))
