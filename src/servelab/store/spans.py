"""The server's own account of each request: OTLP trace spans (vLLM's ``llm_request``) decoded
into ``server_spans`` rows. The table's DDL and its row type live here, beside the decoder, so
that the one definition of what a span column means sits with the attribute it comes from;
``store.db`` applies ``DDL`` with schema.sql.

vLLM 0.26 (``vllm/v1/engine/output_processor.py::do_tracing``) sends one SERVER span per
finished request: start = the API server's arrival time, attributes in seconds::

    gen_ai.latency.time_to_first_token   first output at the API server - arrival
    gen_ai.latency.e2e                   last output at the API server - arrival
    gen_ai.latency.time_in_queue         engine: first scheduled - queued
    gen_ai.latency.time_in_model_prefill engine: first token - first scheduled
    gen_ai.latency.time_in_model_decode  engine: last token - first token
    gen_ai.latency.time_in_model_inference engine: last token - first scheduled
    gen_ai.usage.prompt_tokens / completion_tokens, gen_ai.request.id (the external id)

The simulator's exporter (``sim/server/otlp_export.py``) writes the same names from here.
Bodies come as protobuf (``application/x-protobuf``) or OTLP/JSON (``application/json``, ids in
hex, 64-bit integers as strings), optionally gzip-compressed.
"""
from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass

import orjson

from servelab.core.errors import ServelabError

SPAN_NAME = "llm_request"
REQUEST_ID = "gen_ai.request.id"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
# every gen_ai.latency.* attribute vLLM 0.26 sends -> its column (seconds, as sent)
LATENCY = {
    "gen_ai.latency.time_in_queue": "time_in_queue_s",
    "gen_ai.latency.time_to_first_token": "time_to_first_token_s",
    "gen_ai.latency.time_in_model_prefill": "time_in_model_prefill_s",
    "gen_ai.latency.time_in_model_decode": "time_in_model_decode_s",
    "gen_ai.latency.time_in_model_inference": "time_in_model_inference_s",
    "gen_ai.latency.e2e": "e2e_s",
}
MAX_BODY_BYTES = 64 << 20        # decompressed; an exporter batch of 512 spans is ~300 kB
PROTOBUF = "application/x-protobuf"
JSON = "application/json"

DDL = """
CREATE TABLE IF NOT EXISTS server_spans (
    run_id VARCHAR,                  -- the run that was active when the span arrived
    server_request_id VARCHAR,       -- gen_ai.request.id as the server names it (cmpl-ID-0)
    request_id VARCHAR,              -- the id servelab sent (X-Request-Id); NULL: not this run's
    received_unix DOUBLE,            -- when servelab received the export (its own clock)
    start_unix DOUBLE,               -- span start: the server's arrival time (server clock)
    end_unix DOUBLE,                 -- span end (server clock)
    time_in_queue_s DOUBLE,
    time_to_first_token_s DOUBLE,
    time_in_model_prefill_s DOUBLE,
    time_in_model_decode_s DOUBLE,
    time_in_model_inference_s DOUBLE,
    e2e_s DOUBLE,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    trace_id VARCHAR,                -- hex
    span_id VARCHAR,                 -- hex
    service_name VARCHAR,            -- the resource's service.name (vllm, servelab-sim)
    attributes JSON,                 -- every attribute of the span, as sent
    duplicate BOOLEAN                -- a span of this server_request_id came before in the run
);
"""


@dataclass(slots=True)
class SpanRow:
    """``server_spans``: one per request span received (duplicates too, flagged)."""
    run_id: str | None = None
    server_request_id: str | None = None
    request_id: str | None = None
    received_unix: float | None = None
    start_unix: float | None = None
    end_unix: float | None = None
    time_in_queue_s: float | None = None
    time_to_first_token_s: float | None = None
    time_in_model_prefill_s: float | None = None
    time_in_model_decode_s: float | None = None
    time_in_model_inference_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    trace_id: str | None = None
    span_id: str | None = None
    service_name: str | None = None
    attributes: str | None = None
    duplicate: bool = False


class SpanBodyError(ServelabError):
    """An export body that is not OTLP traces (answered 400, counted)."""


@dataclass(slots=True)
class Decoded:
    rows: list            # SpanRow, one per request span
    other_spans: int      # spans that are not per request (vLLM's start-up spans), skipped
    unnamed: int          # llm_request spans without gen_ai.request.id, skipped


def sent_id(server_request_id: str | None, run_id: str | None) -> str | None:
    """The X-Request-Id servelab sent, from the server's request id: vLLM names a request
    ``cmpl-<X-Request-Id>-<index>`` (``chatcmpl-`` for chat) and may add a suffix; servelab's ids
    are ``<run_id>-w<slot>-<seq>``, so the id is found whole whatever comes after it (as
    ``client/request.py::_judge`` accepts a response id that ends with it). None: not one of
    this run's requests (a preflight probe, another client, an earlier run)."""
    if not server_request_id or not run_id:
        return None
    m = re.match(r"(?:chatcmpl-|cmpl-)?(" + re.escape(run_id) + r"-w\d+-\d+)(?:-.*)?$",
                 server_request_id)
    return m.group(1) if m else None


def inflate(body: bytes, encoding: str | None) -> bytes:
    """The body without its Content-Encoding (gzip, deflate or none), at most MAX_BODY_BYTES."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "deflate"):
        raise SpanBodyError(f"Content-Encoding {encoding!r}: allowed gzip, deflate or none")
    wbits = 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, MAX_BODY_BYTES + 1)
    except zlib.error as exc:
        raise SpanBodyError(f"Content-Encoding {enc}: the body does not inflate ({exc})") \
            from None
    if len(out) > MAX_BODY_BYTES:
        raise SpanBodyError(f"the body inflates past {MAX_BODY_BYTES >> 20} MiB; send smaller "
                            "batches (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)")
    return out


def decode_export(body: bytes, content_type: str | None, run_id: str | None,
                  received_unix: float, encoding: str | None = None) -> Decoded:
    """An OTLP/HTTP ExportTraceServiceRequest body -> rows (``duplicate`` left False: the
    receiver knows what came before)."""
    data = inflate(body, encoding)
    ctype = (content_type or PROTOBUF).split(";")[0].strip().lower()
    if ctype == JSON:
        spans = _json_spans(data)
    elif ctype in (PROTOBUF, "application/protobuf", "application/octet-stream"):
        spans = _protobuf_spans(data)
    else:
        raise SpanBodyError(f"Content-Type {content_type!r}: allowed {PROTOBUF} or {JSON}")
    out = Decoded([], 0, 0)
    for service, name, trace_id, span_id, start_ns, end_ns, attrs in spans:
        if name != SPAN_NAME:
            out.other_spans += 1
            continue
        rid = attrs.get(REQUEST_ID)
        if not isinstance(rid, str) or not rid:
            out.unnamed += 1
            continue
        row = SpanRow(run_id=run_id, server_request_id=rid, request_id=sent_id(rid, run_id),
                      received_unix=received_unix, start_unix=_seconds(start_ns),
                      end_unix=_seconds(end_ns), prompt_tokens=_int(attrs.get(PROMPT_TOKENS)),
                      completion_tokens=_int(attrs.get(COMPLETION_TOKENS)), trace_id=trace_id,
                      span_id=span_id, service_name=service,
                      attributes=orjson.dumps(attrs).decode())
        for attr, column in LATENCY.items():
            setattr(row, column, _float(attrs.get(attr)))
        out.rows.append(row)
    return out


def count_spans(body: bytes, content_type: str | None, encoding: str | None = None) -> int:
    """How many spans a body holds (for a body refused whole: its spans are counted dropped)."""
    data = inflate(body, encoding)
    if (content_type or "").split(";")[0].strip().lower() == JSON:
        return sum(1 for _ in _json_spans(data))
    return sum(1 for _ in _protobuf_spans(data))


def _seconds(ns) -> float | None:
    try:
        ns = int(ns)
    except (TypeError, ValueError):
        return None
    return ns / 1e9 if ns > 0 else None


def _int(v) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def _float(v) -> float | None:
    try:
        f = None if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return None
    return f if f is not None and f == f and abs(f) != float("inf") else None


# ---- protobuf ------------------------------------------------------------------------------
def _protobuf_spans(data: bytes):
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import \
        ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(data)
    except DecodeError as exc:
        raise SpanBodyError(f"not an OTLP ExportTraceServiceRequest in protobuf ({exc}); send "
                            f"OTLP/HTTP traces ({PROTOBUF} or {JSON})") from None
    for rs in req.resource_spans:
        service = _pb_attrs(rs.resource.attributes).get("service.name")
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield (service, s.name, s.trace_id.hex(), s.span_id.hex(),
                       s.start_time_unix_nano, s.end_time_unix_nano, _pb_attrs(s.attributes))


def _pb_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _pb_attrs(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def _pb_attrs(kvs) -> dict:
    return {kv.key: _pb_value(kv.value) for kv in kvs}


# ---- OTLP/JSON -----------------------------------------------------------------------------
def _json_spans(data: bytes):
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SpanBodyError(f"not JSON ({exc}); send OTLP/HTTP traces") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
        raise SpanBodyError("OTLP/JSON: expected an object with a resourceSpans list")
    for rs in doc.get("resourceSpans") or []:
        if not isinstance(rs, dict):
            raise SpanBodyError("OTLP/JSON: resourceSpans[] must be objects")
        service = _json_attrs((rs.get("resource") or {}).get("attributes")).get("service.name")
        for ss in rs.get("scopeSpans") or []:
            for s in (ss or {}).get("spans") or []:
                if not isinstance(s, dict):
                    raise SpanBodyError("OTLP/JSON: spans[] must be objects")
                yield (service, s.get("name"), s.get("traceId"), s.get("spanId"),
                       s.get("startTimeUnixNano"), s.get("endTimeUnixNano"),
                       _json_attrs(s.get("attributes")))


def _json_value(v):
    if not isinstance(v, dict) or not v:
        return None
    kind, x = next(iter(v.items()))
    if kind == "intValue":
        return _int(x)
    if kind == "doubleValue":
        return _float(x)
    if kind == "arrayValue":
        return [_json_value(e) for e in (x or {}).get("values") or []]
    if kind == "kvlistValue":
        return _json_attrs((x or {}).get("values"))
    return x


def _json_attrs(kvs) -> dict:
    if not isinstance(kvs, list):
        return {}
    return {kv.get("key"): _json_value(kv.get("value")) for kv in kvs
            if isinstance(kv, dict) and isinstance(kv.get("key"), str)}
