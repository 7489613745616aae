"""server_spans and request_phases on real vLLM 0.26 spans (tests/analysis/data/otlp_h200, its
README says how they were captured): decoding (protobuf, OTLP/JSON, gzip), the id servelab sent,
the clock offset, every phase, and a lost or duplicated span reported rather than joined."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import orjson
import pytest

from servelab.analysis.views import open_results_db
from servelab.store import spans
from servelab.store.db import Store

DATA = Path(__file__).parent / "data" / "otlp_h200"
RUNS = ("cap_chat", "cap_prefill")


def bodies() -> list[bytes]:
    data, out, i = (DATA / "otlp_traces.bin").read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack(">Q", data[i:i + 8])
        out.append(data[i + 8:i + 8 + n])
        i += 8 + n
    return out


def real_rows() -> list[spans.SpanRow]:
    """Each span under the run its id belongs to (the capture holds two runs; a live master
    knows its one run), the foreign probe under the first."""
    rows = []
    for body in bodies():
        by_run = {run: spans.decode_export(body, spans.PROTOBUF, run, 1.0).rows for run in RUNS}
        for k, row in enumerate(by_run[RUNS[0]]):
            other = by_run[RUNS[1]][k]
            rows.append(row if row.request_id or not other.request_id else other)
    return rows


def load(tmp_path, rows) -> "duckdb.DuckDBPyConnection":  # noqa: F821
    con = open_results_db(tmp_path / "phases.duckdb")
    store = Store(con)
    for table in ("runs", "stages", "requests"):
        store.append_ndjson(table, (DATA / f"{table}.jsonl").read_bytes())
    store.append_rows("server_spans", rows)
    return con


def test_real_vllm_bodies_decode_to_one_row_per_request_span():
    got = [spans.decode_export(b, "application/x-protobuf", "cap_chat", 5.0) for b in bodies()]
    rows = [r for d in got for r in d.rows]
    assert len(rows) == 41 and sum(d.other_spans for d in got) == 2
    assert sum(d.unnamed for d in got) == 0
    first = next(r for r in rows if r.server_request_id == "cmpl-cap_chat-w0-110-0")
    assert first.request_id == "cap_chat-w0-110"
    assert first.service_name == "vllm" and len(first.span_id) == 16 and len(first.trace_id) == 32
    attrs = orjson.loads(first.attributes)
    assert first.time_in_queue_s == attrs["gen_ai.latency.time_in_queue"]
    assert first.e2e_s == attrs["gen_ai.latency.e2e"]
    assert first.completion_tokens == attrs["gen_ai.usage.completion_tokens"] > 0
    assert abs(first.end_unix - first.start_unix - first.e2e_s) < 0.005
    assert sum(r.request_id is not None for r in rows) == 30   # cap_chat's own
    foreign = [r for r in rows if not r.server_request_id.startswith("cmpl-cap")]
    assert len(foreign) == 1 and foreign[0].request_id is None


@pytest.mark.parametrize("server_id, run, sent", [
    ("cmpl-r1-w0-12-0", "r1", "r1-w0-12"),
    ("chatcmpl-r1-w3-7", "r1", "r1-w3-7"),
    ("chatcmpl-r1-w3-7-9f2c1a", "r1", "r1-w3-7"),
    ("cmpl-r1-w0-12-0", "r2", None),            # another run's request
    ("cmpl-a3da5ad161027449-0", "r1", None),    # no X-Request-Id (a probe)
    ("cmpl-r1-w0-12-0", None, None),
    ("cmpl-20261201-1200-abc-w1-3-0", "20261201-1200-abc", "20261201-1200-abc-w1-3"),
])
def test_sent_id_strips_the_prefix_and_any_suffix(server_id, run, sent):
    assert spans.sent_id(server_id, run) == sent


def _json_body(rows: list[spans.SpanRow]) -> bytes:
    def attr(k, v):
        key = "intValue" if isinstance(v, int) else "doubleValue" if isinstance(v, float) \
            else "stringValue"
        return {"key": k, "value": {key: str(v) if key == "intValue" else v}}
    return orjson.dumps({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", "vllm")]},
        "scopeSpans": [{"scope": {"name": "vllm.tracing.otel"}, "spans": [
            {"name": "llm_request", "traceId": r.trace_id, "spanId": r.span_id,
             "startTimeUnixNano": str(round(r.start_unix * 1e9)),
             "endTimeUnixNano": str(round(r.end_unix * 1e9)),
             "attributes": [attr(k, v) for k, v in orjson.loads(r.attributes).items()]}
            for r in rows]}]}]})


def test_otlp_json_and_gzip_give_the_same_rows_as_protobuf():
    body = bodies()[3]
    want = spans.decode_export(body, spans.PROTOBUF, "cap_chat", 1.0).rows
    assert want
    for got in (spans.decode_export(gzip.compress(body), spans.PROTOBUF, "cap_chat", 1.0,
                                    encoding="gzip").rows,
                spans.decode_export(_json_body(want), "application/json; charset=utf-8",
                                    "cap_chat", 1.0).rows):
        assert [(r.server_request_id, r.request_id, r.time_in_queue_s, r.prompt_tokens,
                 r.span_id) for r in got] == \
            [(r.server_request_id, r.request_id, r.time_in_queue_s, r.prompt_tokens,
              r.span_id) for r in want]
        assert all(abs(a.start_unix - b.start_unix) < 1e-6 for a, b in zip(got, want))


@pytest.mark.parametrize("body, ctype, enc, says", [
    (b"\xff\xfe not protobuf", spans.PROTOBUF, None, "protobuf"),
    (b"{}", "text/plain", None, "Content-Type"),
    (b"not gzip", spans.PROTOBUF, "gzip", "inflate"),
    (b"[1, 2]", "application/json", None, "resourceSpans"),
    (b"x", spans.PROTOBUF, "br", "Content-Encoding"),
])
def test_bad_bodies_are_named(body, ctype, enc, says):
    with pytest.raises(spans.SpanBodyError, match=says):
        spans.decode_export(body, ctype, "r", 1.0, encoding=enc)


def test_every_real_request_gets_its_phases_and_they_add_up(tmp_path):
    con = load(tmp_path, real_rows())
    clock = con.execute("SELECT run_id, clock_offset_ms, clock_offset_source, clock_offset_lo_ms,"
                        " clock_offset_hi_ms FROM span_clock ORDER BY 1").fetchall()
    # same host: 0 inside the bounds the smallest delays give (the first token's way back, the
    # lower bound, is longer than the way in: detokenize and SSE at 256 users, under 10 ms)
    assert [(r, o, s) for r, o, s, _, _ in clock] == [("cap_chat", 0.0, "same_host"),
                                                     ("cap_prefill", 0.0, "same_host")]
    assert all(-10 < lo <= 0 <= hi < 5 for *_, lo, hi in clock)
    rows = con.execute(
        "SELECT ttft_ms, to_server_ms, queue_ms, prefill_ms, to_client_ms, ttft_residual_ms, "
        "server_other_ms, e2e_ms, decode_ms, last_to_client_ms, e2e_residual_ms, has_span "
        "FROM request_phases").fetchall()
    assert len(rows) == 40 and all(r[-1] for r in rows)
    for (ttft, to_s, q, p, to_c, res, other, e2e, dec, last, e2e_res, _) in rows:
        assert to_s + q + p + to_c + res == pytest.approx(ttft, abs=1e-6)
        assert to_s + q + p + dec + last + e2e_res == pytest.approx(e2e, abs=1e-6)
        assert 0 < to_s < 1000 and 0 < to_c < 1000 and q >= 0 and p > 0   # 256 users: ~100 ms
        # the residual is the server's own unexplained part, within the client's anchor error
        assert res == pytest.approx(other, abs=3.0)
    join = con.execute("SELECT run_id, requests_sent, spans, spans_without_request, "
                       "duplicate_spans, requests_without_span FROM span_join ORDER BY 1"
                       ).fetchall()
    assert join == [("cap_chat", 30, 31, 1, 0, 0), ("cap_prefill", 10, 10, 0, 0, 0)]
    summary = con.execute("SELECT level, requests, with_span, queue_p50_ms, prefill_p50_ms, "
                          "ttft_residual_p99_ms FROM phase_stage_summary WHERE run_id = "
                          "'cap_chat' ORDER BY level").fetchall()
    assert [s[:3] for s in summary] == [(lv, 6, 6) for lv in (1.0, 16.0, 64.0, 128.0, 256.0)]
    assert summary[0][4] > 20   # prefill of ~1,000 tokens on the H200, tens of ms


def test_a_lost_span_and_a_duplicated_one_are_reported_not_joined(tmp_path):
    rows = [r for r in real_rows() if r.request_id != "cap_chat-w0-110"]
    dup = next(r for r in rows if r.request_id == "cap_prefill-w0-735")
    again = spans.SpanRow(**{k: getattr(dup, k) for k in spans.SpanRow.__slots__})
    again.received_unix, again.duplicate = dup.received_unix + 1.0, True
    again.time_in_queue_s = 99.0     # a second, different account must not replace the first
    con = load(tmp_path, rows + [again])
    join = dict((r[0], r[1:]) for r in con.execute(
        "SELECT run_id, duplicate_spans, requests_without_span, completed_without_span "
        "FROM span_join").fetchall())
    assert join["cap_chat"] == (0, 1, 1) and join["cap_prefill"] == (1, 0, 0)
    lost = con.execute("SELECT has_span, spans, queue_ms, ttft_residual_ms FROM request_phases "
                       "WHERE request_id = 'cap_chat-w0-110'").fetchone()
    assert lost == (False, 0, None, None)
    twice = con.execute("SELECT spans, duplicate_spans, queue_ms FROM request_phases WHERE "
                        "request_id = 'cap_prefill-w0-735'").fetchone()
    assert twice[:2] == (2, 1) and twice[2] == pytest.approx(dup.time_in_queue_s * 1000)
    per_stage = con.execute("SELECT sum(without_span), sum(duplicate_spans) FROM "
                            "phase_stage_summary").fetchone()
    assert per_stage == (1, 1)


def test_span_row_matches_its_table(tmp_path):
    con = open_results_db(tmp_path / "x.duckdb")
    cols = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'server_spans' ORDER BY "
                                      "ordinal_position").fetchall()]
    assert cols == list(spans.SpanRow.__slots__)


def test_a_text_less_stream_tail_does_not_move_the_clock(tmp_path):
    """Random weights on the H200 ended streams with tokens that carried no text yet: the
    client's last text chunk came up to 286 ms before the server's last output, and bounds taken
    from the last token put one same-host run's offset at 143 ms (2026-12-02 capture)."""
    con = load(tmp_path, real_rows())
    before = con.execute("SELECT * FROM span_clock ORDER BY run_id").fetchall()
    con.execute("UPDATE requests SET last_token_unix = last_token_unix - 0.3 "
                "WHERE request_id = 'cap_chat-w0-110'")
    assert con.execute("SELECT * FROM span_clock ORDER BY run_id").fetchall() == before
    e2e = con.execute("SELECT last_to_client_ms FROM request_phases "
                      "WHERE request_id = 'cap_chat-w0-110'").fetchone()[0]
    assert e2e < -250   # the E2E side reports it as it is: a negative last hop, never hidden
