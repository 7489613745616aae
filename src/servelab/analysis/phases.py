"""Where TTFT goes, read from ``phase_stage_summary`` and ``span_join`` (analysis/
45_request_phases.sql defines every phase): the lines ``servelab run`` prints after its summary
and the rows of the report's stacked panel. The SQL says what each phase is; this module only
picks, orders and words them."""
from __future__ import annotations

from servelab.analysis.catalogue import format_value

# The stacked panel's segments, bottom to top: (column of phase_stage_summary, label).
SEGMENTS = (("to_server_p50_ms", "network + API server"), ("queue_p50_ms", "engine queue"),
            ("prefill_p50_ms", "prefill"), ("to_client_p50_ms", "stream to client"),
            ("ttft_residual_p50_ms", "residual"))


def p99(column: str) -> str:
    """The p99 column of a segment's median column."""
    return column.replace("_p50_", "_p99_")


def stage_phases(con, run_id: str) -> list[dict]:
    """One dict per measured stage with spans: level, the segments' medians and p99s, TTFT p50,
    counts and the clock offset."""
    names = ["stage", "level", "requests", "with_span", "without_span", "duplicate_spans",
             "ttft_p50_ms", *(c for c, _ in SEGMENTS), *(p99(c) for c, _ in SEGMENTS),
             "clock_offset_ms", "clock_offset_lo_ms", "clock_offset_hi_ms",
             "clock_offset_source"]
    rows = con.execute(
        f"SELECT {', '.join(names)} FROM phase_stage_summary WHERE run_id = ? AND with_span > 0 "
        f"ORDER BY stage", [run_id]).fetchall()
    return [dict(zip(names, r)) for r in rows]


def join_counts(con, run_id: str) -> dict | None:
    row = con.execute("SELECT spans, spans_without_request, duplicate_spans, "
                      "requests_without_span, requests_sent FROM span_join WHERE run_id = ?",
                      [run_id]).fetchone()
    if row is None:
        return None
    return dict(zip(("spans", "spans_without_request", "duplicate_spans",
                     "requests_without_span", "requests_sent"), row))


def phase_lines(con, run_id: str) -> list[str]:
    """Per stage the phase medians; then what did not join. Empty when the server sent no
    span (it was not started with --otlp-traces-endpoint)."""
    counts = join_counts(con, run_id)
    if not counts or not counts["spans"]:
        return []
    out = []
    stages = stage_phases(con, run_id)
    for s in stages:
        parts = ", ".join(f"{label} {format_value(c, s[c])}" for c, label in SEGMENTS)
        out.append(f"server phases, stage {s['stage']} (load {s['level']:g}), medians in ms: "
                   f"{parts} (TTFT p50 {format_value('ttft_p50_ms', s['ttft_p50_ms'])}, residual "
                   f"p99 {format_value('ttft_residual_p99_ms', s['ttft_residual_p99_ms'])}; "
                   f"{s['with_span']} of "
                   f"{s['requests']} requests with a span)")
    if stages:
        s = stages[0]
        out.append(f"server clock offset {format_value('clock_offset_ms', s['clock_offset_ms'])} ms "
                   f"({s['clock_offset_source']}: span_clock)")
    missing = [f"{counts[k]} {what}" for k, what in (
        ("requests_without_span", "requests without a span"),
        ("spans_without_request", "spans with no request of this run"),
        ("duplicate_spans", "duplicate spans")) if counts[k]]
    if missing:
        out.append("server spans not joined: " + ", ".join(missing) + " (span_join)")
    return out
