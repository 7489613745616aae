"""The master's OTLP receiver over real sockets into the real writer and DuckDB file: protobuf,
JSON and gzip bodies of real vLLM spans, duplicates flagged, bad bodies refused with a named
reason, a flood dropped and counted (with OTLP's partial success) while every request row is
still stored, and the simulator's exporter thread sending to it."""
from __future__ import annotations

import gzip
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import duckdb
import gevent
import orjson
from gevent.threadpool import ThreadPool
from geventhttpclient import HTTPClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from servelab.loadgen.master.accounts import WorkerAccounts
from servelab.loadgen.master.spans_intake import SpanIntake
from servelab.loadgen.master.writer import DbWriter
from servelab.sim.server.otlp_export import SpanExporter
from servelab.store import spans
from servelab.store.db import open_db
from servelab.store.rows import RequestRow

# The captured vLLM spans and their reader are the analysis tests' (tests/analysis/data/otlp_h200;
# --import-mode=importlib: that folder is not on the path unless its conftest ran).
sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
from test_request_phases import bodies  # noqa: E402

RUN = "cap_chat"


def setup(tmp_path, **kw):
    pool = ThreadPool(1)
    accounts = WorkerAccounts(["local"])
    writer = DbWriter(pool, open_db, str(tmp_path / "s.duckdb"), RUN, accounts,
                      lambda *a: None)
    intake = SpanIntake(0, **kw)
    intake.begin(RUN, writer)
    return pool, writer, intake


def finish(pool, writer, intake):
    writer.wait_idle(10)
    intake.close()
    writer.close()
    pool.kill()


def post(intake, body: bytes, ctype=spans.PROTOBUF, encoding=None, path="/v1/traces"):
    client = HTTPClient("127.0.0.1", intake.port, connection_timeout=5, network_timeout=10)
    headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
    try:
        resp = client.post(path, body=body, headers=headers)
        return resp.status_code, resp.read()
    finally:
        client.close()


def test_protobuf_gzip_and_json_exports_land_as_rows_and_repeats_are_flagged(tmp_path):
    pool, writer, intake = setup(tmp_path)
    b = bodies()
    status, answer = post(intake, b[0])
    assert status == 200 and not ExportTraceServiceResponse.FromString(answer).HasField(
        "partial_success")
    for body in b[1:8]:
        assert post(intake, gzip.compress(body), encoding="gzip")[0] == 200
    rows = spans.decode_export(b[8], spans.PROTOBUF, RUN, 1.0).rows
    as_json = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"name": "llm_request", "traceId": r.trace_id, "spanId": r.span_id,
         "startTimeUnixNano": str(round(r.start_unix * 1e9)),
         "endTimeUnixNano": str(round(r.end_unix * 1e9)),
         "attributes": [{"key": k, "value": {"doubleValue": v} if isinstance(v, float) else
                         {"stringValue": v}} for k, v in orjson.loads(r.attributes).items()
                        if not isinstance(v, int)]} for r in rows]}]}]}
    status, answer = post(intake, orjson.dumps(as_json), ctype="application/json")
    assert status == 200 and orjson.loads(answer) == {}
    assert post(intake, b[1])[0] == 200          # the same export again: its spans repeat
    status, answer = post(intake, b"\x0a\xff garbage")
    assert status == 400 and b"protobuf" in answer
    assert post(intake, b[0], path="/v1/metrics")[0] == 404
    finish(pool, writer, intake)
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    n, dups, ours = con.execute("SELECT count(*), count(*) FILTER (WHERE duplicate), "
                                "count(request_id) FROM server_spans").fetchone()
    per_body = [len(spans.decode_export(x, spans.PROTOBUF, RUN, 1.0).rows) for x in b[:9]]
    assert n == sum(per_body) + per_body[1] and dups == per_body[1] > 0
    assert ours > 0 and intake.counts["refused"] == 1 and intake.counts["other_spans"] >= 1
    json_row = con.execute("SELECT time_in_queue_s, start_unix FROM server_spans WHERE "
                           "server_request_id = ?", [rows[0].server_request_id]).fetchone()
    assert json_row[0] == rows[0].time_in_queue_s and abs(json_row[1] - rows[0].start_unix) < 1e-6


def test_a_flood_is_dropped_and_counted_and_no_request_row_is_lost(tmp_path):
    pool, writer, intake = setup(tmp_path, max_pending=30)
    accounts = writer.accounts
    # the database thread is busy for a while: spans pile up in the writer's queue
    writer.call(lambda store: time.sleep(1.5))
    gevent.sleep(0.1)
    body = bodies()[5]
    per = len(spans.decode_export(body, spans.PROTOBUF, RUN, 1.0).rows)
    rejected = 0
    for k in range(40):
        status, answer = post(intake, body)
        assert status == 200
        resp = ExportTraceServiceResponse.FromString(answer)
        rejected += resp.partial_success.rejected_spans
        if k % 4 == 0:   # a worker's row batch in the middle of the flood
            rows = b"".join(orjson.dumps(RequestRow(RUN, f"{RUN}-w0-{k}-{j}", "w0", k * 10 + j,
                                                    ttft_ms=1.0)) + b"\n" for j in range(10))
            writer.batch("local", {"run_id": RUN, "worker": "w0", "batch": k, "rows": rows,
                                   "n_rows": 10, "health": b""})
    assert rejected == intake.counts["dropped"] > 0
    assert "dropped" in intake.notes()[0] and "no request row was lost" in intake.notes()[0]
    finish(pool, writer, intake)
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    stored = con.execute("SELECT count(*) FROM server_spans").fetchone()[0]
    assert stored + rejected == 40 * per
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 100
    assert accounts.get("w0").stored == 100


def test_the_simulators_exporter_thread_sends_vllm_spans_to_the_receiver(tmp_path):
    pool, writer, intake = setup(tmp_path)
    exporter = SpanExporter(intake.endpoint, interval_s=0.1, epoch_offset=1_800_000_000.0)
    for k in range(30):
        t = float(k)
        rec = SimpleNamespace(request_id=f"chatcmpl-{RUN}-w0-{k}", kind="chat", arrival=t,
                              first_token=t + 0.05, chunk_times=[t + 0.05, t + 0.2],
                              prompt_tokens=100, output_tokens=8, max_tokens=8)
        seq = SimpleNamespace(arrival_time=t + 0.001, first_scheduled_time=t + 0.011,
                              first_token_time=t + 0.045, last_token_time=t + 0.195)
        exporter.record(rec, seq)
    deadline = time.monotonic() + 10
    while intake.counts["spans"] < 30 and time.monotonic() < deadline:
        gevent.sleep(0.05)   # the exporter's blocking client is on its own thread
    exporter.close()
    finish(pool, writer, intake)
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    got = con.execute("SELECT request_id, time_in_queue_s, time_in_model_prefill_s, "
                      "time_to_first_token_s, e2e_s, start_unix, completion_tokens, "
                      "service_name FROM server_spans ORDER BY start_unix").fetchall()
    assert len(got) == 30 and exporter.sent == 30 and exporter.dropped == 0
    rid, queue, prefill, ttft, e2e, start, out, service = got[3]
    assert rid == f"{RUN}-w0-3" and service == "servelab-sim" and out == 8
    assert (round(queue, 6), round(prefill, 6), round(ttft, 6), round(e2e, 6)) == \
        (0.01, 0.034, 0.05, 0.2)
    assert abs(start - 1_800_000_003.0) < 1e-6
