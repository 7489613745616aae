"""Helpers shared by the simulator-engine tests (as fixtures: pytest runs with --import-mode=importlib):
run a closed loop in virtual time and summarise it the way a benchmark client would."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from servelab.sim.engine import build_engine_config, make_engines
from servelab.core.quantiles import quantile_cont
from servelab.sim.engine.virtual import VirtualRequest, VirtualResult
from servelab.sim.engine.virtual_users import run_closed_loop


@dataclass
class Summary:
    throughput: float
    tpot_p50: float
    ttft_p50: float
    ttft_p99: float
    itl_p99: float
    e2e_p50: float
    preemptions: int
    max_waiting: int
    median_waiting_after_warmup: float
    max_kv_usage: float
    finished: int
    result: VirtualResult


def uniform_requests(prompt: tuple[int, int], output: tuple[int, int], seed: int = 0, **extra):
    rng = random.Random(seed)

    def make(i: int) -> VirtualRequest:
        return VirtualRequest(prompt_len=rng.randint(*prompt), output_len=rng.randint(*output), **extra)
    return make


def summarize(res: VirtualResult, warmup_s: float) -> Summary:
    fin = res.finished(warmup_s, res.end_s)
    itls = [x for r in fin for x in r.itls]
    return Summary(
        throughput=res.output_throughput(warmup_s, res.end_s),
        tpot_p50=quantile_cont((r.tpot for r in fin), 0.5),
        ttft_p50=quantile_cont((r.ttft for r in fin), 0.5),
        ttft_p99=quantile_cont((r.ttft for r in fin), 0.99),
        itl_p99=quantile_cont(itls, 0.99),
        e2e_p50=quantile_cont((r.e2e for r in fin), 0.5),
        preemptions=sum(e.stats.num_preemptions_total for e in res.engines),
        max_waiting=max((s.num_waiting for s in res.samples), default=0),
        median_waiting_after_warmup=quantile_cont((s.num_waiting for s in res.samples if s.t >= warmup_s),
                                                  0.5),
        max_kv_usage=max((s.kv_usage for s in res.samples), default=0.0),
        finished=len(fin),
        result=res,
    )


def closed_run(hardware, model, serve_args, users, duration_s, prompt=(128, 512), output=(64, 192),
               seed=0, warmup_frac=0.25, config=None, **request_extra) -> Summary:
    cfg = config or build_engine_config(hardware, model, serve_args)
    res = run_closed_loop(make_engines(cfg, seed), users,
                          uniform_requests(prompt, output, seed, **request_extra), duration_s=duration_s)
    return summarize(res, duration_s * warmup_frac)


@pytest.fixture
def closed():
    """``closed(hardware, model, serve_args, users, duration_s, prompt=(lo, hi), output=(lo, hi))``"""
    return closed_run
