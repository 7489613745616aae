"""SYNTHETIC runs for the report and comparison tests: a small closed-loop model of a serving
engine (not the simulator, not a real server) that produces rows shaped like what
`servelab run` records: requests with chunk lists, stages with warm-up and cool-down, scraped
vLLM metrics (gauges and counters for two engines) and the generator's health samples.

Load follows Little's law on a machine with `batch` slots: at `users` concurrent users, the
engine runs min(users, batch) and queues the rest, so TTFT grows with the queue and the decode
pace slows with the batch. Runs are tagged synthetic=true.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis_rows import request


@dataclass
class Variant:
    name: str
    prefill_ms: float = 60.0  # TTFT at no load
    itl_ms: float = 12.0  # per-token pace at batch 1
    itl_per_batch: float = 0.6  # extra ms per token for each running request
    batch: int = 8
    spec_tokens: int = 1  # tokens per chunk on average (speculative decoding when > 1)
    failure_rate: float = 0.0
    gpus: int = 1


def synthetic_run(run_id: str, variant: Variant, levels=(1, 2, 4, 8, 16), *, start: float = 1_710_000_000.0,
                  stage_s: float = 12.0, warmup_s: float = 2.0, cooldown_s: float = 2.0, output_tokens: int = 40, profile: str = "synthetic-sweep", seed: int = 0, tags=None,
                  flags=None) -> dict[str, list[dict]]:
    rng = np.random.default_rng(seed)
    runs = [dict(run_id=run_id, started_unix=start, finished_unix=start + len(levels) * stage_s,
                 profile_name=profile, load_kind="concurrency", target="http://127.0.0.1:8000",
                 variant=variant.name, hardware="synthetic", model="synthetic/model", gpus=variant.gpus,
                 status="completed", flags=list(flags or []), tags={"synthetic": "true", **(tags or {})})]
    classes = [dict(run_id=run_id, class_name="chat", weight=0.7, slo_ttft_ms=400.0, slo_tpot_ms=40.0,
                    slo_itl_ms=120.0, slo_e2e_ms=4000.0),
               dict(run_id=run_id, class_name="summarize", weight=0.3, slo_ttft_ms=900.0, slo_tpot_ms=None,
                    slo_itl_ms=None, slo_e2e_ms=8000.0)]
    stages, reqs, metrics, health = [], [], [], []
    counters = {"vllm:num_preemptions_total": 0.0, "vllm:generation_tokens_total": 0.0,
                "vllm:prompt_tokens_total": 0.0, "vllm:prefix_cache_queries_total": 0.0,
                "vllm:prefix_cache_hits_total": 0.0}
    if variant.spec_tokens > 1:
        counters.update({"vllm:spec_decode_num_drafts_total": 0.0, "vllm:spec_decode_num_draft_tokens_total": 0.0,
                         "vllm:spec_decode_num_accepted_tokens_total": 0.0})
    seq = 0
    for s, users in enumerate(levels):
        t0 = start + s * stage_s
        m0, m1 = t0 + warmup_s, t0 + stage_s - cooldown_s
        stages.append(dict(run_id=run_id, stage=s, kind="concurrency", level=float(users), started_unix=t0,
                           reached_unix=t0, measure_start_unix=m0, measure_end_unix=m1, ended_unix=t0 + stage_s))
        running = min(users, variant.batch)
        queued = max(users - variant.batch, 0)
        pace = variant.itl_ms + variant.itl_per_batch * running
        # Closed loop: each user sends its next request as soon as the previous one ends.
        for user in range(users):
            sent = t0 + 0.05 * user
            while sent < t0 + stage_s - cooldown_s:
                i = seq
                cls = "chat" if i % 10 < 7 else "summarize"
                ttft = variant.prefill_ms * (1 + 0.1 * running) * (1 + queued / variant.batch) * rng.lognormal(0, 0.25)
                n = output_tokens if cls == "chat" else output_tokens // 2
                offsets, tokens, t, left = [round(ttft, 3)], [1], ttft, n - 1
                while left > 0:
                    k = int(min(left, rng.poisson(variant.spec_tokens - 1) + 1)) if variant.spec_tokens > 1 else 1
                    gap = pace * (1 + 0.35 * (k - 1)) * rng.lognormal(0, 0.15)
                    if rng.random() < 0.01 * queued:  # a preemption stall under overload
                        gap += 20 * pace
                    t += gap
                    offsets.append(round(t, 3))
                    tokens.append(k)
                    left -= k
                error = "http_503" if rng.random() < variant.failure_rate * (1 + queued) else None
                common = dict(warmup=sent < m0, seq=seq, worker=f"w{seq % 2}")
                if error:
                    reqs.append(request(run_id, f"{run_id}-{seq}", cls, s, float(users), sent, error=error,
                                        output=0, **common))
                    sent += 0.5
                else:
                    reqs.append(request(run_id, f"{run_id}-{seq}", cls, s, float(users), sent, offsets, tokens,
                                        prompt=512, cached=128 if i % 3 == 0 else 0, **common))
                    sent += offsets[-1] / 1000 + 0.01
                seq += 1
        for sec in range(int(stage_s)):
            t = t0 + sec + 0.5
            tok_rate = 1000.0 / pace * running
            counters["vllm:generation_tokens_total"] += tok_rate
            counters["vllm:prompt_tokens_total"] += 512 * users / 3
            counters["vllm:prefix_cache_queries_total"] += 512 * users / 3
            counters["vllm:prefix_cache_hits_total"] += 128 * users / 9
            counters["vllm:num_preemptions_total"] += float(rng.poisson(0.3 * queued))
            if variant.spec_tokens > 1:
                drafts = tok_rate / variant.spec_tokens
                counters["vllm:spec_decode_num_drafts_total"] += drafts
                counters["vllm:spec_decode_num_draft_tokens_total"] += drafts * 3
                counters["vllm:spec_decode_num_accepted_tokens_total"] += drafts * (variant.spec_tokens - 1)
            for engine in ("0", "1"):
                labels = {"engine": engine, "model_name": "synthetic/model"}
                gauges = {"vllm:num_requests_running": running / 2, "vllm:num_requests_waiting": queued / 2,
                          "vllm:kv_cache_usage_perc": min(0.98, 0.1 + 0.85 * running / variant.batch)}
                for name, value in {**gauges, **{k: v / 2 for k, v in counters.items()}}.items():
                    metrics.append(dict(run_id=run_id, t_unix=t, name=name, labels=labels, value=float(value)))
            for w in ("w0", "w1"):
                health.append(dict(run_id=run_id, worker=w, t_unix=t, cpu_percent=10.0 + 3 * users,
                                   loop_lag_ms=0.5 + 0.1 * users, loop_lag_p99_ms=0.4, in_flight=users // 2,
                                   backlog=0, rss_mb=120.0))
    workers = [dict(run_id=run_id, worker=w, host="localhost", produced=seq // 2, stored=seq // 2, in_flight_lost=0,
                    status="finished", spool_path=None) for w in ("w0", "w1")]
    return dict(runs=runs, run_classes=classes, stages=stages, requests=reqs, server_metrics=metrics,
                client_health=health, run_workers=workers)
