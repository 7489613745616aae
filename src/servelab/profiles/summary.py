"""Plain-text summaries of a profile (what `servelab profiles show` prints).

Class statistics come from sampling the planner's own request sequence, so they show exactly what
would be sent. Closed-loop plans have no fixed request count: the estimate assumes an unloaded
7B-class server that takes ASSUMED_BASE_S + ASSUMED_PER_OUTPUT_S per output token +
ASSUMED_PER_PROMPT_S per prompt token per request (plus think time for sessions), and says so.
"""
from __future__ import annotations

import itertools
import textwrap

import numpy as np

from servelab.core.quantiles import quantiles_cont
from servelab.profiles.durations import format_duration
from servelab.profiles.planner import RequestPlanner
from servelab.profiles.schema import Profile

SAMPLES = 10_000
ASSUMED_BASE_S = 0.05
ASSUMED_PER_OUTPUT_S = 0.02
ASSUMED_PER_PROMPT_S = 0.0001


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(["  " + line for line in lines])


def _stats(values: np.ndarray) -> str:
    if values.size == 0:
        return "-"
    mean = values.mean()
    p50, p99 = quantiles_cont(values.tolist(), (0.5, 0.99))
    return f"{mean:.0f} / {p50:.0f} / {p99:.0f}"


def _slo(spec) -> str:
    names = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2e"}
    items = spec.slo.thresholds().items()
    return " ".join(f"{names[k]}<={v:g}ms" for k, v in items) if items else "-"


def _wrap(text: str) -> str:
    return textwrap.fill(text, 100, initial_indent="  ", subsequent_indent="    ")


def sample_requests(planner: RequestPlanner, n: int = SAMPLES) -> list:
    return list(itertools.islice(planner.requests(), n))


def summarize(profile: Profile, seed: int | None = None, samples: int = SAMPLES) -> str:
    planner = RequestPlanner(profile, seed)
    reqs = sample_requests(planner, samples)
    kind = profile.load.kind
    out = [f"profile {profile.name}" + (f"  ({profile.path})" if profile.path else ""),
           textwrap.fill(" ".join(profile.description.split()), 100, initial_indent="  ",
                         subsequent_indent="  "),
           f"  endpoint {profile.endpoint} | model {profile.model} | seed {planner.seed} | "
           f"salt {'on' if profile.salt else 'off'} | tokenizer "
           f"{profile.tokenizer or '(server /tokenize, else --tokenizer, else 4 chars/token)'}",
           ""]
    out.append(f"classes ({len(reqs):,} sampled requests; token lengths mean / p50 / p99)")
    total_weight = sum(c.weight for c in profile.classes)
    rows, details, latency = [], [], 0.0
    for spec in profile.classes:
        mine = [r for r in reqs if r.class_name == spec.name]
        prompt = np.array([r.prompt_tokens for r in mine], float)
        output = np.array([r.output_tokens for r in mine], float)
        share = len(mine) / max(1, len(reqs))
        prefix = "-" if not spec.prefix_tokens else f"{spec.prefix_tokens} x{spec.groups}"
        session = "-"
        think = 0.0
        if spec.session is not None:
            firsts = [r for r in mine if r.turn == 1]
            turns = np.mean([r.turns for r in firsts]) if firsts else 0
            think = float(np.mean([r.think_time_s for r in mine if r.turn > 1] or [0]))
            session = f"{turns:.1f} turns, think {think:.1f}s"
        rows.append([spec.name, f"{spec.weight:g}", f"{100 * spec.weight / total_weight:.0f}%",
                     _stats(prompt), _stats(output), prefix, session, _slo(spec)])
        if kind == "trace":
            details.append(f"  {spec.name}: lengths from the trace; text {spec.text}")
        else:
            details.append(f"  {spec.name}: prompt {spec.prompt_tokens.describe('tokens')}; "
                           f"output {spec.output_tokens.describe('tokens')}; text {spec.text}")
        if mine:
            latency += share * (ASSUMED_BASE_S + ASSUMED_PER_OUTPUT_S * output.mean()
                                + ASSUMED_PER_PROMPT_S * prompt.mean()
                                + (think if spec.session is not None else 0.0))
    out.append(table(["class", "weight", "share", "prompt", "output", "prefix", "session",
                      "SLO"], rows))
    out.extend(details)
    if any(c.session is not None for c in profile.classes):
        out.append("  (sessions: turn 1 counts its whole prompt, later turns the tokens they add "
                   "to the history)")
    out.append("")
    out.extend(_load_lines(planner, latency))
    return "\n".join(out)


def _load_lines(planner: RequestPlanner, latency_s: float) -> list[str]:
    kind, plan, stages = planner.load_kind, planner.plan, planner.stages()
    total_time = sum(s.duration_s for s in stages)
    if kind in ("concurrency", "ramp"):
        title = {"concurrency": "concurrency (closed loop: each user sends, waits, sends again)",
                 "ramp": "ramp (closed loop, Locust-style user stages)"}[kind]
        rows, expected = [], 0.0
        for s in stages:
            n = s.users * s.duration_s / latency_s if latency_s > 0 else 0.0
            expected += n
            row = [s.index, s.users]
            if kind == "ramp":
                row.append(f"{s.spawn_rate:g}/s")
            else:
                row.append(format_duration(s.warmup_s))
            row += [format_duration(s.hold_s), format_duration(s.duration_s), f"~{n:,.0f}"]
            rows.append(row)
        head = ["stage", "users", "spawn" if kind == "ramp" else "warmup", "hold", "duration",
                "expected requests"]
        note = (f"closed loop: depends on server latency; estimated at "
                f"{latency_s * 1000:.0f} ms per request ({ASSUMED_BASE_S * 1000:.0f} ms + "
                f"{ASSUMED_PER_OUTPUT_S * 1000:.0f} ms per output token + "
                f"{ASSUMED_PER_PROMPT_S * 1000:.1f} ms per prompt token, plus think time)")
        return [f"load: {title}, {len(stages)} stages", table(head, rows),
                _wrap(f"total planned time {format_duration(total_time)}; expected requests "
                      f"~{expected:,.0f} ({note})")]
    if kind == "rate":
        arrival = plan.arrival + (f" (burstiness {plan.burstiness:g})" if plan.burstiness else "")
        rows, expected = [], 0.0
        for s in stages:
            expected += s.expected_requests
            rows.append([s.index, f"{s.rate:g}/s", format_duration(s.warmup_s),
                         format_duration(s.hold_s), format_duration(s.duration_s),
                         f"{s.expected_requests:,.0f}", f"{len(planner.arrival_times(s.index)):,}"])
        cap = f"; at most {plan.max_in_flight} in flight" if plan.max_in_flight else ""
        return [f"load: rate (open loop, {arrival} arrivals{cap}), {len(stages)} stages",
                table(["stage", "rate", "warmup", "hold", "duration", "expected (rate x time)",
                       "planned"], rows),
                f"  total planned time {format_duration(total_time)}; expected requests "
                f"{expected:,.0f} (rate x duration per stage)"]
    s = stages[0]
    cap = f"; at most {plan.max_in_flight} in flight" if plan.max_in_flight else ""
    return [f"load: trace replay of {plan.file} (time_scale {plan.time_scale:g}{cap})",
            table(["stage", "rows", "duration", "mean rate"],
                  [[0, f"{s.expected_requests:,.0f}", format_duration(s.duration_s),
                    f"{s.expected_requests / max(s.duration_s, 1e-9):.2f}/s"]]),
            f"  total planned time {format_duration(total_time)}; expected requests "
            f"{s.expected_requests:,.0f} (one per trace row)"]
