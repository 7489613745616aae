"""The metric catalogue: each figure servelab shows, listed once with its label, unit, better
direction, digits and the view column it is read from, and the one way each is written as text.

The SQL views (analysis/*.sql) define what a metric IS; this module only says how it is named and
shown. The terminal tables (summary.py), the HTML report (report.py), ``servelab compare`` and the
matrix all format through ``format_value`` and ``format_ratio``, so one cell reads the same
everywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # the key servelab uses for it, and its column in `view`
    label: str  # in sentences and comparison rows: "p99 TTFT"
    header: str  # as a table column heading: "TTFT p99"
    unit: str  # "ms", "tokens/s", "requests/s", "share" (0..1, shown as a percentage), "count"
    better: str | None  # "lower" | "higher" | None (shown, never judged)
    digits: int = 1  # decimals (shares: of the percentage)
    view: str = "stage_summary"

    @property
    def column(self) -> str:
        return self.name


def _latencies(key: str, name: str, *qs: int) -> list[Metric]:
    """The percentiles `qs` of one latency: ttft_p99_ms, 'p99 TTFT', 'TTFT p99'."""
    return [Metric(f"{key}_p{q}_ms", f"p{q} {name}", f"{name} p{q}", "ms", "lower") for q in qs]


STAGE_METRICS = [
    *_latencies("ttft", "TTFT", 50, 90, 99),
    Metric("ttft_p99_adj_ms", "error-adjusted p99 TTFT", "TTFT p99 adj", "ms", "lower"),
    *_latencies("itl", "ITL", 50, 99),
    Metric("itl_chunk_p99_ms", "p99 chunk ITL", "ITL chunk p99", "ms", "lower"),
    *_latencies("tpot", "TPOT", 50, 99),
    *_latencies("e2e", "E2E", 50, 99),
    Metric("send_lag_p99_ms", "p99 send lag", "send lag p99", "ms", "lower"),
    Metric("e2e_sched_p99_ms", "p99 E2E from the scheduled time", "E2E sched p99", "ms", "lower"),
    Metric("output_tokens_per_s", "output tokens/s", "out tok/s", "tokens/s", "higher"),
    Metric("output_tokens_per_s_per_gpu", "output tokens/s per GPU", "tok/s/GPU", "tokens/s", "higher"),
    Metric("output_tokens_per_s_per_user", "output tokens/s per user", "tok/s/user", "tokens/s", "higher"),
    Metric("requests_per_s", "requests/s", "req/s", "requests/s", "higher", 2),
    Metric("goodput", "goodput", "goodput", "requests/s", "higher", 2),
    Metric("slo_attainment", "SLO attainment", "SLO met", "share", "higher"),
    Metric("error_rate", "error rate", "error rate", "share", "lower"),
]

SERVER_METRICS = [
    Metric(name, label, header, unit, None, digits, "server_stage_summary")
    for name, label, header, unit, digits in [
        ("running_mean", "running requests (mean)", "running", "count", 1),
        ("waiting_mean", "waiting requests (mean)", "waiting", "count", 1),
        ("waiting_max", "waiting requests (max)", "waiting max", "count", 0),
        ("kv_cache_usage_mean", "KV-cache use (mean)", "KV use", "share", 1),
        ("kv_cache_usage_max", "KV-cache use (max)", "KV max", "share", 1),
        ("preemptions_per_s", "preemptions/s", "preemptions/s", "1/s", 2),
        ("generation_tokens_per_s", "generated tokens/s (server)", "gen tok/s (server)", "tokens/s", 1),
        ("prefix_cache_hit_rate", "prefix-cache hit rate", "prefix hit", "share", 1),
        ("spec_acceptance_rate", "draft acceptance rate", "spec accept", "share", 1),
        ("spec_mean_acceptance_length", "mean acceptance length", "accept len", "tokens", 2),
    ]
]

FRONTIER_METRICS = [
    Metric(name, label, label, unit, None, digits, "slo_frontier")
    for name, label, unit, digits in [
        ("target", "target", "share", 1),
        ("max_level_meeting_target", "max load meeting target", "load", 2),
        ("goodput_at_max_level", "goodput there", "requests/s", 2),
        ("first_failing_level", "first failing load", "load", 2),
        ("slo_ttft_ms", "TTFT SLO", "ms", 1),
        ("knee_level", "knee (p99 TTFT > SLO)", "load", 2),
        ("knee_level_interp", "knee, interpolated", "load", 2),
    ]
]

# Where TTFT and E2E go (analysis/45_request_phases.sql): the server's span joined to the row.
PHASE_METRICS = [
    Metric(f"{key}_{q}_ms", f"{q} {name}", f"{head} {q}", "ms", None, 1, "phase_stage_summary")
    for key, name, head in [
        ("to_server", "client send -> server arrival", "to server"),
        ("queue", "engine queue", "queue"), ("prefill", "prefill", "prefill"),
        ("server_other", "server TTFT outside queue and prefill", "server other"),
        ("to_client", "server first token -> client first chunk", "to client"),
        ("ttft_residual", "TTFT residual", "TTFT resid"), ("decode", "decode", "decode"),
        ("last_to_client", "server last token -> client last chunk", "last to client"),
        ("e2e_residual", "E2E residual", "E2E resid")]
    for q in ("p50", "p99")
] + [Metric("clock_offset_ms", "server clock offset", "clock offset", "ms", None, 2,
            "phase_stage_summary")]

# GPU samples per stage (analysis/42_gpu_stage_energy.sql): energy per output token and the rest.
ENERGY_METRICS = [
    Metric("joules_per_output_token", "energy per output token", "J/token", "J/token", "lower", 3,
           "gpu_stage_energy"),
    Metric("output_tokens_per_joule", "output tokens per joule", "tok/J", "tokens/J", "higher", 2,
           "gpu_stage_energy"),
    # GPU samples without decimals: at their sizes (hundreds of W, MHz, MiB) a decimal is noise.
    *[Metric(name, label, header, unit, None, 0, "gpu_stage_energy")
      for name, label, header, unit in [
          ("power_mean_w", "GPU power (mean, all GPUs)", "power", "W"),
          ("energy_j", "GPU energy in the window", "energy", "J"),
          ("util_mean_pct", "GPU utilisation (mean)", "GPU util", "%"),
          ("sm_clock_mean_mhz", "SM clock (mean)", "SM clock", "MHz"),
          ("mem_used_max_mib", "GPU memory used (max)", "mem max", "MiB"),
          ("temp_max_c", "GPU temperature (max)", "temp max", "C")]],
]

METRICS: dict[str, Metric] = {m.name: m for m in STAGE_METRICS + SERVER_METRICS + FRONTIER_METRICS
                              + PHASE_METRICS + ENERGY_METRICS}

# What `servelab compare`, the report's comparison and the matrix verdict judge, in display order.
COMPARED = [METRICS[n] for n in (
    "output_tokens_per_s", "goodput", "slo_attainment", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
    "itl_p99_ms", "tpot_p50_ms", "e2e_p99_ms", "error_rate")]

# What each run flag means, for the terminal, the report and the comparison caveats.
FLAG_MEANING = {
    "generator_saturated": "the load generator was itself the bottleneck (CPU or event-loop lag): "
    "latencies include client delay and the offered load was not fully delivered",
    "host_busy": "other processes on the load generator's host took the CPU (its own CPU was low "
    "while the host was busy): latencies include that wait; run on a quieter host",
    "rows_lost": "some request rows were produced but never stored: counts and rates are low",
    "bad_values": "the server sent values out of range or of the wrong type (e.g. usage counts): "
    "they are stored as NULL with the reason in requests.data_quality, and those requests are "
    "classified bad_usage",
    "predicted": "figures are a prediction (cost model / virtual time), not a measurement of a real server",
    "unverified": "the server was not verified to be the variant it claims to be (the evidence was "
    "missing): read its figures as those of an unknown configuration",
    "variant_mismatch": "the server was checked and does NOT run what its variant claims (e.g. FP8 "
    "W8A8 claimed, weight-only FP8 through Marlin served): its figures are not the variant's",
}


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value, digits: int = 1) -> str:
    """A number with `digits` decimals (thousands grouped, no decimals from 10,000 up); '-' for
    a missing one, 'inf' for an error-adjusted percentile that failures made infinite."""
    if _missing(value):
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if abs(value) >= 10000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def pct(value, digits: int = 1) -> str:
    return "-" if _missing(value) else f"{100 * value:.{digits}f}%"


def level_text(value) -> str:
    """A load level: users as an integer, rates with the decimals they need."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:g}"


def format_value(metric: str | Metric, value) -> str:
    m = metric if isinstance(metric, Metric) else METRICS[metric]
    return pct(value, m.digits) if m.unit == "share" else fmt(value, m.digits)


def format_interval(metric: str | Metric, interval) -> str:
    """' [lo, hi]' in the metric's own format, or '' without an interval."""
    if not interval:
        return ""
    return f" [{format_value(metric, interval[0])}, {format_value(metric, interval[1])}]"


def format_ratio(ratio, times: str = "x") -> str:
    """' x1.23' for a ratio to the baseline; '' when there is none (NaN: a zero baseline under a
    non-zero value). An infinite ratio is shown ('xinf'): it says the value is infinite where the
    baseline's is not, which hiding it would not."""
    if _missing(ratio):
        return ""
    return f" {times}{float(ratio):.2f}"


def better(metric: str, a: float, b: float) -> bool:
    """a is strictly better than b (a missing value is never better; anything beats one)."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return a > b if METRICS[metric].better == "higher" else a < b


def comparison_cell(result, label: str, baseline: str, times: str = "x") -> tuple[str, str] | None:
    """One cell of a comparison table (a compare.MetricResult, one group): 'value [lo, hi]' and
    the ratio to the baseline (' x0.83', '' for the baseline itself or no ratio); None when the
    group has no such stage. Renderers add their own noise and winner marks."""
    if label not in result.values:
        return None
    text = format_value(result.metric, result.values[label]) + format_interval(
        result.metric, result.intervals.get(label))
    shown = label != baseline and label in result.ratios
    return text, format_ratio(result.ratios[label], times) if shown else ""
