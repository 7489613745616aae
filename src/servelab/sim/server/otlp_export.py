"""The simulator's request spans, as vLLM 0.26 sends them with ``--otlp-traces-endpoint``: one
``llm_request`` SERVER span per finished request, with the same attribute names and meanings
(``store.spans`` lists them; vLLM's ``output_processor.py::do_tracing``), OTLP/HTTP protobuf.

``record`` is called by the server when a request finishes and only appends a tuple to a bounded
deque (2,048, OpenTelemetry's BatchSpanProcessor default; beyond it spans are dropped and
counted), so the serving loop never waits on the exporter. A background thread sends what is
queued every ``interval_s`` (0.5 s) or as soon as 512 spans wait, with a plain blocking HTTP
client: it is not on the event loop. A failed export is tried once more on the next tick, then
dropped and counted, as the SDK's exporter gives up after its retries.

Times, as vLLM takes them (the simulator's arrival is when the body is in, before tokenizing):
span start = arrival; time_to_first_token = first chunk written - arrival; e2e = last chunk
written - arrival; time_in_queue = first scheduled - queued (the engine's add, at arrival);
time_in_model_prefill = first token - first scheduled; time_in_model_decode = last token - first
token; time_in_model_inference = last token - first scheduled (engine step ends, same clock).
"""
from __future__ import annotations

import http.client
import logging
import os
import threading
from collections import deque
from urllib.parse import urlsplit

from servelab.core.errors import ServelabError
from servelab.store import spans

log = logging.getLogger("servelab.sim")
FLAG = "--otlp-traces-endpoint"
MAX_QUEUE = 2048
MAX_BATCH = 512
SERVICE = "servelab-sim"
SCOPE = "vllm.tracing.otel"   # the scope vLLM's request spans come under


def endpoint_from(ignored: list[str]) -> str | None:
    """The endpoint among the accepted vLLM flags (``ServeArgs.ignored``: ``FLAG=value``)."""
    for item in ignored:
        if item.startswith(FLAG + "="):
            return item.split("=", 1)[1] or None
    return None


def check_endpoint(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an OTLP/HTTP traces URL; a ServelabError naming the flag."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ServelabError(f"{FLAG} {url!r}: the simulator sends OTLP/HTTP (protobuf) to an "
                            "http:// URL, e.g. http://127.0.0.1:4318/v1/traces")
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    if protocol != "http/protobuf":
        raise ServelabError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol}: the simulator "
                            "sends http/protobuf only; unset it or set http/protobuf")
    return parts.hostname, parts.port or 4318, parts.path or "/v1/traces"


class SpanExporter:
    def __init__(self, url: str, interval_s: float = 0.5, epoch_offset: float = 0.0):
        self.url = url
        self.host, self.port, self.path = check_endpoint(url)
        self.interval_s = interval_s
        self.epoch_offset = epoch_offset   # server clock -> Unix seconds
        self.queue: deque = deque()
        self.sent = 0
        self.dropped = 0
        self._retry: list | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="servelab-otlp", daemon=True)
        self._thread.start()

    # ---- the serving loop ---------------------------------------------------------------
    def record(self, rec, seq) -> None:
        """A finished request (``ServerRecord`` and the engine's ``Sequence``)."""
        if rec.first_token is None or seq is None or seq.first_scheduled_time is None:
            return   # vLLM traces requests that produced output
        if len(self.queue) >= MAX_QUEUE:
            self.dropped += 1
            return
        last = rec.chunk_times[-1] if rec.chunk_times else rec.first_token
        rid = rec.request_id if rec.kind == "chat" else f"{rec.request_id}-0"
        self.queue.append((rid, rec.arrival, rec.first_token, last, seq.arrival_time,
                           seq.first_scheduled_time, seq.first_token_time, seq.last_token_time,
                           rec.prompt_tokens, rec.output_tokens, rec.max_tokens))
        if len(self.queue) >= MAX_BATCH:
            self._wake.set()

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (the spans of the last requests) and stop."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    # ---- the exporter thread ------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            stopping = self._stop.is_set()
            while self.queue or self._retry:
                batch = self._retry or [self.queue.popleft()
                                        for _ in range(min(MAX_BATCH, len(self.queue)))]
                if not self._send(batch):
                    if self._retry is not None or stopping:
                        self.dropped += len(batch)
                        self._retry = None
                    else:
                        self._retry = batch
                    break
                self._retry = None
                self.sent += len(batch)
            if stopping:
                return

    def _send(self, batch: list) -> bool:
        body = encode(batch, self.epoch_offset)
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
            try:
                conn.request("POST", self.path, body, {"Content-Type": spans.PROTOBUF})
                resp = conn.getresponse()
                resp.read()
                ok = 200 <= resp.status < 300
            finally:
                conn.close()
        except OSError as exc:
            ok, why = False, str(exc)
        else:
            why = f"HTTP {resp.status}"
        if not ok and not self._warned:
            self._warned = True
            log.warning("servelab sim: sending spans to %s failed (%s); retried once, then "
                        "dropped and counted", self.url, why)
        return ok


def encode(batch: list, epoch_offset: float) -> bytes:
    """One ExportTraceServiceRequest of the queued tuples."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import \
        ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    _attr(rs.resource.attributes, "service.name", SERVICE)
    ss = rs.scope_spans.add()
    ss.scope.name = SCOPE
    for (rid, arrival, first, last, queued, scheduled, tok1, tokn, n_prompt, n_out,
         max_tokens) in batch:
        s = ss.spans.add()
        s.trace_id, s.span_id = os.urandom(16), os.urandom(8)
        s.name = spans.SPAN_NAME
        s.kind = Span.SPAN_KIND_SERVER
        s.start_time_unix_nano = round((arrival + epoch_offset) * 1e9)
        s.end_time_unix_nano = round((last + epoch_offset) * 1e9)
        tokn = tokn if tokn is not None else tok1
        values = {
            "gen_ai.latency.time_to_first_token": first - arrival,
            "gen_ai.latency.e2e": last - arrival,
            "gen_ai.latency.time_in_queue": scheduled - queued,
            spans.PROMPT_TOKENS: n_prompt,
            spans.COMPLETION_TOKENS: n_out,
            "gen_ai.latency.time_in_model_prefill": (tok1 - scheduled) if tok1 else None,
            "gen_ai.latency.time_in_model_decode": (tokn - tok1) if tok1 else None,
            "gen_ai.latency.time_in_model_inference": (tokn - scheduled) if tokn else None,
            spans.REQUEST_ID: rid,
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.request.n": 1,
        }
        for key, value in values.items():
            if value is not None:
                _attr(s.attributes, key, value)
    return req.SerializeToString()


def _attr(attrs, key: str, value) -> None:
    kv = attrs.add()
    kv.key = key
    if isinstance(value, str):
        kv.value.string_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.double_value = float(value)


def start(ignored: list[str], epoch_offset: float) -> SpanExporter | None:
    url = endpoint_from(ignored)
    return None if url is None else SpanExporter(url, epoch_offset=epoch_offset)

