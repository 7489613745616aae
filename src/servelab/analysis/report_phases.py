"""The report's "where TTFT goes" panel: per load level, a stacked bar of the medians of the
phases the server's own spans give (``phase_stage_summary``, analysis/45_request_phases.sql),
with each phase's p99 in the bar's hover text and in the table below it.

The bars are inline SVG, not a PNG: a segment's ``<title>`` is its hover text in any browser and
the page stays one self-contained file. A phase's median can be negative (the residual, or the
way to the server when the clock offset is estimated): positive segments stack up from zero and
negative ones down from it, so no segment is hidden in another. A bar's total is a sum of
medians, not the median TTFT; the TTFT median is drawn beside it as a tick to compare.
A run without spans gets one line saying how to have them.
"""
from __future__ import annotations

import duckdb

from .catalogue import format_value, level_text
from .phases import SEGMENTS, join_counts, p99, stage_phases
from .report_html import esc, table

COLORS = ("#8c96a8", "#d9822b", "#2d6cdf", "#1b9e77", "#c2c7d1")   # one per SEGMENTS entry
WIDTH, HEIGHT = 900, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 190, 16, 44
NO_SPANS = ("No server spans for this run, so TTFT is not split into its phases. A vLLM server "
            "sends them when started with <code>--otlp-traces-endpoint "
            "http://127.0.0.1:PORT/v1/traces</code> and the environment "
            "<code>OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf</code>, PORT being "
            "<code>servelab run --otlp-port PORT</code>'s; <code>servelab run</code> on the "
            "simulator, <code>--backend local</code> and Compose pass it themselves.")


def phases_html(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """The panel of one run: heading, bars, table and what did not join; the note without
    spans."""
    try:
        counts = join_counts(con, run_id)
        stages = stage_phases(con, run_id) if counts and counts["spans"] else []
    except duckdb.CatalogException:   # a file whose views predate server_spans
        counts, stages = None, []
    head = "<h3>Where TTFT goes</h3>"
    if not stages:
        return f'{head}<p class="sub" data-phases="none">{NO_SPANS}</p>'
    s0 = stages[0]
    offset = (f"server clock offset {format_value('clock_offset_ms', s0['clock_offset_ms'])} ms "
              f"({esc(s0['clock_offset_source'])}, within "
              f"[{format_value('clock_offset_ms', s0['clock_offset_lo_ms'])}, "
              f"{format_value('clock_offset_ms', s0['clock_offset_hi_ms'])}] ms; view "
              f"<code>span_clock</code>)")
    missing = [f"{counts[k]} {what}" for k, what in (
        ("requests_without_span", "requests without a span"),
        ("spans_without_request", "spans with no request of this run"),
        ("duplicate_spans", "duplicate spans")) if counts[k]]
    note = (f'<div class="warn">server spans not joined: {esc(", ".join(missing))} (view '
            "<code>span_join</code>); those requests have no phases</div>" if missing else "")
    return "\n".join([
        head, svg(stages), phase_table(stages), note,
        "<p>From view <code>phase_stage_summary</code> (measured windows, completed requests "
        "with a span): network + API server = client send to the server's arrival stamp; engine "
        "queue and prefill = the span's <code>time_in_queue</code> and "
        "<code>time_in_model_prefill</code>; stream to client = the server's first token to the "
        "client's first chunk; residual = the client's TTFT minus those four, per request. Each "
        "segment is a median (hover for its p99), so a bar's height is close to, not equal to, "
        f"the TTFT median (the black tick). {offset}.</p>"])


def _y(v: float, lo: float, hi: float) -> float:
    return TOP + (hi - v) / (hi - lo) * (HEIGHT - TOP - BOTTOM)


def _ticks(lo: float, hi: float) -> list[float]:
    span = hi - lo
    step = next(s * 10 ** e for e in range(-2, 7) for s in (1, 2, 5) if span / (s * 10 ** e) <= 6)
    first = -(-lo // step) * step
    return [first + i * step for i in range(int((hi - first) // step) + 1)]


def svg(stages: list[dict]) -> str:
    """The stacked bars, one per stage in stage order, labelled by load level."""
    tops, bottoms = [], []
    for s in stages:
        vals = [s[c] or 0.0 for c, _ in SEGMENTS]
        tops.append(max(sum(v for v in vals if v > 0), s["ttft_p50_ms"] or 0.0))
        bottoms.append(sum(v for v in vals if v < 0))
    hi, lo = max(tops + [1.0]) * 1.08, min(bottoms + [0.0]) * 1.08
    plot_w = WIDTH - LEFT - RIGHT
    slot = plot_w / len(stages)
    bar_w = min(slot * 0.6, 80)
    out = [f'<svg class="phases" data-figure="ttft_phases" data-bars="{len(stages)}" '
           f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'xmlns="http://www.w3.org/2000/svg" font-size="11" font-family="sans-serif">',
           "<title>Where TTFT goes: median of each phase per load level, stacked</title>"]
    for t in _ticks(lo, hi):
        y = _y(t, lo, hi)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="{"#555" if t == 0 else "#e3e6ee"}"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text x="14" y="{TOP + (HEIGHT - TOP - BOTTOM) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {TOP + (HEIGHT - TOP - BOTTOM) / 2:.0f})">ms</text>')
    for i, s in enumerate(stages):
        x = LEFT + slot * i + (slot - bar_w) / 2
        up = down = 0.0
        where = f"stage {s['stage']}, load {level_text(s['level'])}"
        out.append(f'<g class="bar" data-stage="{s["stage"]}" '
                   f'data-level="{level_text(s["level"])}">')
        for k, (col, label) in enumerate(SEGMENTS):
            v = s[col]
            if v is None:
                continue
            a, b = (up, up + v) if v >= 0 else (down + v, down)
            up, down = (b, down) if v >= 0 else (up, a)
            y1, y2 = _y(b, lo, hi), _y(a, lo, hi)
            hover = (f"{where}: {label} median {format_value(col, v)} ms, p99 "
                     f"{format_value(p99(col), s[p99(col)])} ms")
            out.append(f'<rect class="seg" data-segment="{esc(label)}" x="{x:.1f}" '
                       f'y="{y1:.1f}" width="{bar_w:.1f}" height="{max(y2 - y1, 0.5):.1f}" '
                       f'fill="{COLORS[k]}"><title>{esc(hover)}</title></rect>')
        if s["ttft_p50_ms"] is not None:
            y = _y(s["ttft_p50_ms"], lo, hi)
            out.append(f'<line class="ttft" x1="{x - 6:.1f}" x2="{x + bar_w + 6:.1f}" '
                       f'y1="{y:.1f}" y2="{y:.1f}" stroke="#000" stroke-width="2"><title>'
                       f'{esc(where)}: client TTFT median '
                       f'{format_value("ttft_p50_ms", s["ttft_p50_ms"])} ms</title></line>')
        out.append(f'<text x="{x + bar_w / 2:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                   f'text-anchor="middle">{esc(level_text(s["level"]))}</text></g>')
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">'
               "load level (stage order)</text>")
    for k, (_, label) in enumerate(reversed(SEGMENTS)):
        y = TOP + 8 + 18 * k
        out.append(f'<rect x="{WIDTH - RIGHT + 16}" y="{y - 9}" width="12" height="12" '
                   f'fill="{COLORS[len(SEGMENTS) - 1 - k]}"/><text x="{WIDTH - RIGHT + 34}" '
                   f'y="{y + 1}">{esc(label)}</text>')
    y = TOP + 8 + 18 * len(SEGMENTS)
    out.append(f'<line x1="{WIDTH - RIGHT + 14}" x2="{WIDTH - RIGHT + 30}" y1="{y - 3}" '
               f'y2="{y - 3}" stroke="#000" stroke-width="2"/><text x="{WIDTH - RIGHT + 34}" '
               f'y="{y + 1}">client TTFT median</text></svg>')
    return "\n".join(out)


def phase_table(stages: list[dict]) -> str:
    """Per stage: requests with a span, each segment's median / p99, the TTFT median."""
    head = (["stage", "load", "requests with a span"]
            + [f"{esc(label)} <small>(p50 / p99 ms)</small>" for _, label in SEGMENTS]
            + ["TTFT p50 <small>(ms)</small>"])
    rows = [[s["stage"], level_text(s["level"]), f"{s['with_span']} of {s['requests']}"]
            + [f"{format_value(c, s[c])} / {format_value(p99(c), s[p99(c)])}"
               for c, _ in SEGMENTS]
            + [format_value("ttft_p50_ms", s["ttft_p50_ms"])] for s in stages]
    return table(head, rows)
