"""The server's own account of each request: OTLP trace spans (vLLM's ``llm_request``; SGLang's
request tree, ``spans_sglang``) decoded into ``server_spans`` rows. The table's DDL and its
row type live here, beside the decoder, so that the one definition of what a span column means
sits with the attribute it comes from; ``store.db`` applies ``DDL`` with schema.sql.

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
from servelab.store import spans_sglang

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
    -- one row per request span; SGLang: per request root span (Req <rid>), with the scheduler's
    -- slices that came before it (store/spans_sglang.py)
    run_id VARCHAR,                  -- the run that was active when the span arrived
    server_request_id VARCHAR,       -- gen_ai.request.id as the server names it (vLLM cmpl-ID-0;
                                     -- SGLang: the root's gen_ai.request.id, else its rid)
    request_id VARCHAR,              -- the id servelab sent (X-Request-Id); NULL: not this run's
    received_unix DOUBLE,            -- when servelab received the export (its own clock)
    start_unix DOUBLE,               -- span start: the server's arrival time (server clock;
                                     -- SGLang: root start, the HTTP handler's received_time)
    end_unix DOUBLE,                 -- span end (server clock; SGLang: root end, finished_time)
    time_in_queue_s DOUBLE,          -- SGLang: slice prefill_waiting (queue entry -> 1st forward)
    time_to_first_token_s DOUBLE,    -- SGLang: root gen_ai.latency.time_to_first_token
    time_in_model_prefill_s DOUBLE,  -- SGLang: slice prefill_forward (1st forward -> prefilled)
    time_in_model_decode_s DOUBLE,   -- SGLang: root gen_ai.latency.time_in_model_decode
    time_in_model_inference_s DOUBLE,  -- SGLang: NULL (its attribute starts at the dispatch)
    e2e_s DOUBLE,                    -- SGLang: root gen_ai.latency.e2e
    prompt_tokens INTEGER,           -- gen_ai.usage.prompt_tokens (SGLang: the root's)
    completion_tokens INTEGER,       -- gen_ai.usage.completion_tokens (SGLang: the root's)
    trace_id VARCHAR,                -- hex
    span_id VARCHAR,                 -- hex (SGLang: the root's)
    service_name VARCHAR,            -- the resource's service.name (vllm, sglang, servelab-sim)
    attributes JSON,                 -- every attribute of the span, as sent (SGLang: the root's,
                                     -- plus servelab.slices {name: [start_ns, end_ns]} used and
                                     -- servelab.missing, the slices that had not come)
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
    other_spans: int      # spans that are not a request's row (vLLM's start-up spans; SGLang's
                          # thread spans and stage slices, its slices kept for their root)
    unnamed: int          # request spans without a request id, skipped


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


def rid_sent_id(rid: str | None, run_id: str | None) -> str | None:
    """The id servelab sent, from a SGLang root span's ``rid`` attribute: SGLang keeps only what
    follows the last "_" (trace.py trace_req_start drops MultiTokenizer's worker prefix), so a
    run id with "_" in it (a matrix run names its variant) is cut; servelab's ids end
    ``-w<slot>-<seq>``, which has none, so the cut part is the run id's own head, put back."""
    if not rid or not run_id:
        return None
    tail = run_id.rsplit("_", 1)[-1]
    if "_" in run_id and re.fullmatch(re.escape(tail) + r"-w\d+-\d+", rid):
        return run_id + rid[len(tail):]
    return sent_id(rid, run_id)


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
    receiver knows what came before). vLLM's ``llm_request`` is a row by itself; SGLang's root
    span becomes one with the scheduler slices of its trace that came before (``spans_sglang``:
    its slices of this body are taken first, whatever their order in it)."""
    data = inflate(body, encoding)
    ctype = (content_type or PROTOBUF).split(";")[0].strip().lower()
    if ctype == JSON:
        spans = _json_spans(data)
    elif ctype in (PROTOBUF, "application/protobuf", "application/octet-stream"):
        spans = _protobuf_spans(data)
    else:
        raise SpanBodyError(f"Content-Type {content_type!r}: allowed {PROTOBUF} or {JSON}")
    out, roots, sglang = Decoded([], 0, 0), [], None
    for service, name, trace_id, span_id, parent_id, start_ns, end_ns, attrs in spans:
        if name == SPAN_NAME:
            row = _vllm_row(run_id, received_unix, service, trace_id, span_id, start_ns,
                            end_ns, attrs)
            _add(out, row)
        elif spans_sglang.is_root(attrs):
            roots.append((service, trace_id, span_id, start_ns, end_ns, attrs))
        else:
            out.other_spans += 1
            if spans_sglang.is_piece(name, attrs):
                sglang = sglang or spans_sglang.assembler_for(run_id)
                sglang.add_slice(trace_id, parent_id, name, start_ns, end_ns)
    for service, trace_id, span_id, start_ns, end_ns, attrs in roots:
        sglang = sglang or spans_sglang.assembler_for(run_id)
        _add(out, _sglang_row(sglang, run_id, received_unix, service, trace_id, span_id,
                              start_ns, end_ns, attrs))
    return out


def notes(run_id: str | None) -> list[str]:
    """What the run's spans could not split or join, beyond the receiver's own counts (SGLang:
    the phases it has no slice for, rows whose slices had not come)."""
    return spans_sglang.notes(run_id)


def _sglang_row(sglang, run_id, received_unix, service, trace_id, span_id, start_ns, end_ns,
                attrs) -> SpanRow | None:
    """A SGLang request's row: its root span's attributes and the scheduler's slices of its
    trace that came before (spans_sglang.py says which column is which span's)."""
    server_id = attrs.get(REQUEST_ID) or attrs.get(spans_sglang.RID)
    if not isinstance(server_id, str) or not server_id:
        return None
    used, resent = sglang.take(trace_id)
    row = SpanRow(run_id=run_id, server_request_id=server_id,
                  request_id=sent_id(attrs.get(REQUEST_ID), run_id)
                  or rid_sent_id(attrs.get(spans_sglang.RID), run_id),
                  received_unix=received_unix, start_unix=_seconds(start_ns),
                  end_unix=_seconds(end_ns), prompt_tokens=_int(attrs.get(PROMPT_TOKENS)),
                  completion_tokens=_int(attrs.get(COMPLETION_TOKENS)), trace_id=trace_id,
                  span_id=span_id, service_name=service)
    for attr, column in spans_sglang.ROOT_LATENCY.items():
        setattr(row, column, _float(attrs.get(attr)))
    for column, seconds in spans_sglang.phases(used).items():
        setattr(row, column, seconds)
    lacking = spans_sglang.missing(used)
    row.attributes = orjson.dumps({**attrs, "servelab.slices": used,
                                   "servelab.missing": lacking}).decode()
    if not resent:
        sglang.count(lacking, row.request_id is None)
    return row


def _add(out: Decoded, row: SpanRow | None) -> None:
    """A request span's row, or one more without a request id (None)."""
    if row is None:
        out.unnamed += 1
    else:
        out.rows.append(row)


def _vllm_row(run_id, received_unix, service, trace_id, span_id, start_ns, end_ns,
              attrs) -> SpanRow | None:
    rid = attrs.get(REQUEST_ID)
    if not isinstance(rid, str) or not rid:
        return None
    row = SpanRow(run_id=run_id, server_request_id=rid, request_id=sent_id(rid, run_id),
                  received_unix=received_unix, start_unix=_seconds(start_ns),
                  end_unix=_seconds(end_ns), prompt_tokens=_int(attrs.get(PROMPT_TOKENS)),
                  completion_tokens=_int(attrs.get(COMPLETION_TOKENS)), trace_id=trace_id,
                  span_id=span_id, service_name=service,
                  attributes=orjson.dumps(attrs).decode())
    for attr, column in LATENCY.items():
        setattr(row, column, _float(attrs.get(attr)))
    return row


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
                       s.parent_span_id.hex() or None, s.start_time_unix_nano,
                       s.end_time_unix_nano, _pb_attrs(s.attributes))


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
                       s.get("parentSpanId") or None, s.get("startTimeUnixNano"),
                       s.get("endTimeUnixNano"), _json_attrs(s.get("attributes")))


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
