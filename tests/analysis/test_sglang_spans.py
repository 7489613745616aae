"""SGLang's request traces into server_spans and request_phases (issue 21, SGLang's point).

There is no real SGLang capture: SGLang cannot run on the lent GPU. The spans here are built the
way SGLang 0.5.23's source builds them (the 0.5.21 wheel builds the same), call for call, at
SGLANG_TRACE_LEVEL=1 (what orchestration/otlp.py gives it):
  - ``sglang/srt/observability/trace.py`` ``TraceReqContext.trace_req_start``: the root span
    ``f"{role} Req {rid[:8]}"`` (role "" when not disaggregated), attributes ``rid`` =
    ``rid.split("_")[-1]`` and ``module`` = ``sglang::request``; ``__create_thread_context``: a
    thread span per process under the root (``thread_label``, ``host_id``, ``pid``, ``tp_rank``);
    ``trace_slice`` / ``trace_slice_start`` / ``trace_slice_end``: stage slices under the
    thread span; ``TraceCustomIdGenerator``: 64-bit trace and span ids.
  - ``req_time_stats.py`` ``APIServerReqTimeStats`` (root start = received_time, tokenize slice,
    root end = finished_time with ``convert_to_gen_ai_span_attrs``), ``SchedulerReqTimeStats``
    ``set_forward_entry_time`` (prefill_waiting: wait queue entry -> forward entry, then
    prefill_forward opened), ``set_prefill_finished_time`` (prefill_forward closed),
    ``set_last_scheduled_time`` (decode_waiting, decode_forward opened), ``set_completion_time``
    (``abort``: decode_forward and the thread span closed).
  - ``managers/tokenizer_manager.py`` ``convert_to_span_attrs``: gen_ai.usage.*, gen_ai.request.id
    (the whole rid), gen_ai.response.* on the root at the finish.
The timestamps come from the captured vLLM run cap_prefill's client rows (data/otlp_h200), so the
phases are checked against a real client's TTFT and E2E.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from servelab.orchestration import otlp
from servelab.specs.variants import load_variant
from servelab.store import spans, spans_sglang

# The client rows are the vLLM capture's (its loader is test_request_phases'), the spans SGLang's.
from test_request_phases import DATA, load

RUN = "cap_prefill"
HOST = "4f1c2a9be07d4e2b9c3d5a6e7f801234"   # /etc/machine-id


@pytest.fixture(autouse=True)
def fresh_assemblers():
    spans_sglang._RUNS.clear()
    yield
    spans_sglang._RUNS.clear()


def ns(t: float) -> int:
    return int(t * 1e9)


def _kv(key, value) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    else:
        kv.value.string_value = value
    return kv


@dataclass
class Req:
    """One request's stamps (seconds, realtime), as SGLang's processes take them."""
    rid: str
    received: float        # OpenAI handler: received_time -> root start
    tokenized: float
    queued: float          # scheduler: wait_queue_entry_time
    forward: float         # first forward_entry_time
    prefilled: float       # prefill_finished_time
    first_out: float       # tokenizer manager: first output batch
    completed: float       # scheduler: set_completion_time
    finished: float        # tokenizer manager: set_finished_time
    prompt: int
    completion: int
    trace: bytes = b""
    root: bytes = b""


class Sglang:
    """Spans as SGLang's tracer makes them; ``export`` packs some into one OTLP body."""

    def __init__(self, seed: int = 0):
        self.rand = random.Random(seed)

    def _id(self) -> bytes:   # TraceCustomIdGenerator: getrandbits(64)
        return self.rand.getrandbits(64).to_bytes(8, "big")

    def span(self, name, trace, parent, start, end, attrs) -> Span:
        s = Span(name=name, trace_id=b"\0" * 8 + trace, span_id=self._id(),
                 parent_span_id=parent or b"", start_time_unix_nano=ns(start),
                 end_time_unix_nano=ns(end))
        s.attributes.extend(_kv(k, v) for k, v in attrs.items())
        return s

    def root(self, r: Req) -> Span:
        """trace_req_start + trace_req_finish(attrs=convert_to_span_attrs + gen_ai latency)."""
        if not r.trace:
            r.trace, r.root = self._id(), self._id()
        attrs = {"rid": r.rid.split("_")[-1], "module": "sglang::request",
                 "gen_ai.usage.completion_tokens": r.completion,
                 "gen_ai.usage.prompt_tokens": r.prompt, "gen_ai.usage.cached_tokens": 0,
                 "gen_ai.request.id": r.rid, "gen_ai.response.model": "qwen2_5_7b",
                 "gen_ai.response.finish_reasons": json.dumps(["length"]),
                 "gen_ai.latency.time_to_first_token": r.first_out - r.received,
                 "gen_ai.latency.e2e": r.finished - r.received,
                 "gen_ai.latency.time_in_model_decode": r.finished - r.first_out,
                 # from api_server_dispatch_finish_time (~ tokenized here): queue included
                 "gen_ai.latency.time_in_model_inference": r.finished - r.tokenized,
                 "gen_ai.latency.time_in_model_prefill": r.first_out - r.tokenized}
        s = self.span(f" Req {r.rid.split('_')[-1][:8]}", r.trace, None, r.received,
                      r.finished, attrs)
        s.span_id = r.root
        return s

    def tokenizer(self, r: Req) -> list[Span]:
        """The tokenizer's thread span (closed by api_server_dispatch's thread_finish_flag)
        and its tokenize slice (level 1; api_server_dispatch is level 2, not traced)."""
        if not r.trace:
            self.root(r)
        thread = self.span(f"Tokenizer(host:{HOST[:8]} | pid:4101)", r.trace, r.root,
                           r.received, r.tokenized,
                           {"host_id": HOST, "pid": 4101, "thread_label": "Tokenizer"})
        return [thread, self.span("tokenize", r.trace, thread.span_id, r.received, r.tokenized,
                                  {})]

    def scheduler(self, r: Req, tp_rank: int = 0, skew: float = 0.0) -> dict[str, Span]:
        """One scheduler rank's thread span and level-1 slices (request_process is level 2)."""
        if not r.trace:
            self.root(r)
        thread = self.span(f"Scheduler [TP {tp_rank}] (host:{HOST[:8]} | pid:{4200 + tp_rank})",
                           r.trace, r.root, r.tokenized + skew, r.completed + skew,
                           {"tp_rank": tp_rank, "host_id": HOST, "pid": 4200 + tp_rank,
                            "thread_label": "Scheduler"})
        decode_at = r.prefilled + 0.0004
        sid = thread.span_id
        return {"thread": thread,
                "prefill_waiting": self.span("prefill_waiting", r.trace, sid, r.queued + skew,
                                             r.forward + skew, {}),
                "prefill_forward": self.span("prefill_forward", r.trace, sid, r.forward + skew,
                                             r.prefilled + skew, {}),
                "decode_waiting": self.span("decode_waiting", r.trace, sid, r.prefilled + skew,
                                            decode_at + skew, {}),
                "decode_forward": self.span("decode_forward", r.trace, sid, decode_at + skew,
                                            r.completed + skew, {})}

    @staticmethod
    def export(span_list, service: str = "sglang") -> bytes:
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(_kv("service.name", service))
        ss = rs.scope_spans.add()
        ss.scope.name = "sglang server"
        ss.spans.extend(span_list)
        return req.SerializeToString()


def client_requests() -> list[dict]:
    rows = [orjson.loads(line) for line in (DATA / "requests.jsonl").read_bytes().splitlines()]
    return [r for r in rows if r["run_id"] == RUN]


def stamps(c: dict, k: int) -> Req:
    """The server's stamps inside the client's: 1 ms each way, a queue growing with k."""
    received, first_out = c["sent_unix"] + 0.001, c["first_token_unix"] - 0.002
    queued = received + 0.004
    forward = queued + 0.010 * (k + 1)
    return Req(c["request_id"], received, received + 0.002, queued, forward,
               first_out - 0.001, first_out, c["last_token_unix"] - 0.0015,
               c["last_token_unix"] - 0.001, 1000, c["output_tokens"])


def decode(body: bytes, received: float = 1.0) -> spans.Decoded:
    return spans.decode_export(body, spans.PROTOBUF, RUN, received)


def test_sglang_tree_decodes_to_one_row_per_request_with_vllms_phases(tmp_path):
    sg, reqs = Sglang(1), [stamps(c, k) for k, c in enumerate(client_requests())]
    sched = [sg.scheduler(r) for r in reqs]
    tok = [sg.tokenizer(r) for r in reqs]
    bodies = [  # as each process's BatchSpanProcessor sends them: first token, then the finish
        sg.export([s[n] for s in sched for n in ("prefill_waiting", "prefill_forward",
                                                  "decode_waiting")]),
        sg.export([x for t in tok for x in t]),
        sg.export([s[n] for s in sched for n in ("decode_forward", "thread")]),
        sg.export([sg.root(r) for r in reqs])]
    got = [decode(b, 10.0 + i) for i, b in enumerate(bodies)]
    assert [len(d.rows) for d in got] == [0, 0, 0, 10]
    assert [d.other_spans for d in got] == [30, 20, 20, 0] and sum(d.unnamed for d in got) == 0
    rows = got[-1].rows
    for r, row in zip(reqs, rows):
        assert (row.request_id, row.server_request_id, row.service_name) == (r.rid, r.rid,
                                                                              "sglang")
        assert row.time_in_queue_s == pytest.approx(r.forward - r.queued, abs=1e-6)
        assert row.time_in_model_prefill_s == pytest.approx(r.prefilled - r.forward, abs=1e-6)
        assert row.time_to_first_token_s == pytest.approx(r.first_out - r.received)
        assert row.time_in_model_decode_s == pytest.approx(r.finished - r.first_out)
        assert row.e2e_s == pytest.approx(r.finished - r.received)
        assert row.time_in_model_inference_s is None     # SGLang's means another interval
        assert row.start_unix == pytest.approx(r.received, abs=1e-6)
        assert (row.prompt_tokens, row.completion_tokens) == (1000, r.completion)
        attrs = orjson.loads(row.attributes)
        assert attrs["servelab.missing"] == [] and set(attrs["servelab.slices"]) == {
            "prefill_waiting", "prefill_forward"}
        assert attrs["gen_ai.latency.time_in_model_prefill"] > row.time_in_model_prefill_s
    con = load(tmp_path, rows)
    phases = con.execute(
        "SELECT ttft_ms, to_server_ms, queue_ms, prefill_ms, to_client_ms, ttft_residual_ms, "
        "server_other_ms, e2e_ms, decode_ms, last_to_client_ms, e2e_residual_ms, has_span "
        "FROM request_phases WHERE run_id = ? ORDER BY request_id", [RUN]).fetchall()
    assert len(phases) == 10 and all(p[-1] for p in phases)
    for r, (ttft, to_s, q, p, to_c, res, other, e2e, dec, last, e2e_res, _) in zip(reqs, phases):
        assert to_s + q + p + to_c + res == pytest.approx(ttft, abs=1e-6)
        assert to_s + q + p + dec + last + e2e_res == pytest.approx(e2e, abs=1e-6)
        assert q == pytest.approx(1000 * (r.forward - r.queued), abs=1e-3)
        assert to_s == pytest.approx(1.0, abs=0.01) and to_c == pytest.approx(2.0, abs=0.01)
        assert other == pytest.approx(ttft - 3 - q - p, abs=0.01) and res == pytest.approx(
            other, abs=0.01)
    join = con.execute("SELECT requests_sent, spans, spans_matched, spans_without_request, "
                       "duplicate_spans, requests_without_span FROM span_join WHERE run_id = ?",
                       [RUN]).fetchone()
    assert join == (10, 10, 10, 0, 0, 0)
    assert spans.notes(RUN) == [spans_sglang.CANNOT_SPLIT]


def test_a_request_whose_slices_come_in_two_exports_and_after_its_root_in_one():
    sg = Sglang(2)
    c = client_requests()
    a, b = stamps(c[0], 0), stamps(c[1], 1)
    sa, sb = sg.scheduler(a), sg.scheduler(b)
    assert decode(sg.export([sa["prefill_waiting"]])).rows == []
    assert decode(sg.export([sa["prefill_forward"], sb["decode_waiting"]])).rows == []
    # b's root and its slices in one body, root first (an exporter shared by processes)
    both = decode(sg.export([sg.root(a), sg.root(b), sb["prefill_forward"],
                             sb["prefill_waiting"]])).rows
    assert [r.request_id for r in both] == [a.rid, b.rid]
    for r, row in ((a, both[0]), (b, both[1])):
        assert row.time_in_queue_s == pytest.approx(r.forward - r.queued, abs=1e-6)
        assert row.time_in_model_prefill_s == pytest.approx(r.prefilled - r.forward, abs=1e-6)
    assert spans_sglang.assembler_for(RUN).pending == {}


def test_a_missing_slice_leaves_nulls_and_is_reported(tmp_path):
    sg = Sglang(3)
    c = client_requests()
    r, other = stamps(c[2], 0), stamps(c[3], 1)
    s = sg.scheduler(r)
    decode(sg.export([s["prefill_waiting"]]))
    row = decode(sg.export([sg.root(r), sg.root(other)])).rows
    assert row[0].time_in_queue_s == pytest.approx(r.forward - r.queued, abs=1e-6)
    assert row[0].time_in_model_prefill_s is None and row[0].time_to_first_token_s > 0
    assert row[1].time_in_queue_s is None and row[1].time_in_model_prefill_s is None
    assert orjson.loads(row[0].attributes)["servelab.missing"] == ["prefill_forward"]
    # the slice that comes after its row is counted, never a second row
    late = decode(sg.export([s["prefill_forward"], s["decode_forward"], s["thread"]]))
    assert late.rows == [] and late.other_spans == 3
    notes = spans.notes(RUN)
    assert notes[0] == spans_sglang.CANNOT_SPLIT
    assert "1 of 2 rows without queue (prefill_waiting), 2 without prefill" in notes[1]
    assert "other TP ranks' too: 1, counted, not joined)" in notes[1]
    con = load(tmp_path, row)
    got = con.execute("SELECT request_id, has_span, queue_ms, prefill_ms, server_ttft_ms, "
                      "ttft_residual_ms FROM request_phases WHERE request_id IN (?, ?) "
                      "ORDER BY request_id", [r.rid, other.rid]).fetchall()
    assert [g[:2] for g in got] == sorted([(r.rid, True), (other.rid, True)])
    assert all(g[3] is None and g[5] is None and g[4] > 0 for g in got)   # NULL, not a guess


def test_a_root_with_no_matching_request_is_counted_in_span_join(tmp_path):
    """SGLang names a request by its ``rid`` body field (or X-Override-Rid on chat), else a
    uuid4 hex (io_struct._normalize_single_inputs); X-Request-Id is not read."""
    sg = Sglang(4)
    c = client_requests()
    ours, probe = stamps(c[4], 0), stamps(c[5], 1)
    probe.rid = "a3da5ad1610274494b1c9e0f2d7e6a55"
    rows = decode(sg.export([sg.root(ours), sg.root(probe)])).rows
    assert [(r.server_request_id, r.request_id) for r in rows] == [(ours.rid, ours.rid),
                                                                  (probe.rid, None)]
    con = load(tmp_path, rows)
    join = con.execute("SELECT requests_sent, spans, spans_matched, spans_without_request, "
                       "requests_without_span FROM span_join WHERE run_id = ?", [RUN]).fetchone()
    assert join == (10, 2, 1, 1, 9)
    spans_sglang._RUNS.clear()
    decode(sg.export([sg.root(probe)]))
    assert "no root span names an id servelab sent" in spans.notes(RUN)[-1]


def test_tp_ranks_give_one_row_and_a_resent_root_the_same_phases():
    sg = Sglang(5)
    r = stamps(client_requests()[6], 2)
    rank0, rank1 = sg.scheduler(r, 0), sg.scheduler(r, 1, skew=0.0002)
    decode(sg.export([rank1["prefill_waiting"], rank0["prefill_waiting"],
                      rank0["prefill_forward"]]))
    first = decode(sg.export([sg.root(r)])).rows[0]
    assert first.time_in_queue_s == pytest.approx(r.forward - r.queued, abs=1e-6)
    assert first.time_in_model_prefill_s == pytest.approx(r.prefilled - r.forward, abs=1e-6)
    again = decode(sg.export([sg.root(r)])).rows[0]   # an exporter's retry: the receiver
    assert (again.time_in_queue_s, again.time_in_model_prefill_s) == (   # flags the duplicate
        first.time_in_queue_s, first.time_in_model_prefill_s)
    assert spans_sglang.assembler_for(RUN).counts["rows"] == 1


@pytest.mark.parametrize("rid, run, sent", [
    ("ngram-r0-w1-5", "m1-spec_ngram-r0", "m1-spec_ngram-r0-w1-5"),   # cut at the last "_"
    ("20261201-1200-abc-w1-3", "20261201-1200-abc", "20261201-1200-abc-w1-3"),
    ("ngram-r0-w1-5", "m1-spec_other-r0", None),
    ("a3da5ad161027449", "r1", None),
])
def test_the_roots_rid_gives_back_the_id_servelab_sent(rid, run, sent):
    assert spans.rid_sent_id(rid, run) == sent


def test_an_sglang_variant_is_told_its_own_flags_and_environment():
    sglang, vllm = load_variant("sglang_bf16", environ={}), load_variant("fp8", environ={})
    url = otlp.endpoint(4999)
    assert otlp.server_args(sglang, url) == ["--enable-trace", "--otlp-traces-endpoint", url]
    assert otlp.server_args(vllm, url) == ["--otlp-traces-endpoint", url]
    env = otlp.server_env(sglang.kind)
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"   # SGLang: grpc else
    assert env["SGLANG_TRACE_LEVEL"] == "1" and otlp.server_env(vllm.kind) == otlp.SERVER_ENV
