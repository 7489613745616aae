"""The server's own spans into the run's database: an OTLP/HTTP receiver (``POST /v1/traces``,
protobuf or JSON, gzip or not) on 127.0.0.1 (``HOST_ENV``: Compose only) in the master, which
owns the database writer.

Each export is decoded in the event loop (the protobuf parse is C; ~10 us per span in Python
after it), marked duplicate when its request's span came before in this run, and handed to the
writer as one call (``DbWriter.call``: stored in the next transaction, like the scraper's pages).
The queue is bounded: while more than ``max_pending`` spans wait for the database, an export is
refused whole and its spans counted dropped, answered with OTLP's partial success
(``rejected_spans``), so the exporter does not resend it and the count is exact. Request rows
never wait on spans: they go through the same writer but are never held back for them.

At the end of a run ``settle`` waits (at most ``SPAN_WAIT_S``) for the spans of completed
requests still on their way: exporters batch (vLLM uses OpenTelemetry's BatchSpanProcessor, 5 s
by default, ``OTEL_BSP_SCHEDULE_DELAY`` in ms; the simulator sends every 0.5 s).
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque

import gevent
from gevent.pywsgi import WSGIServer

from servelab.store import spans

log = logging.getLogger("servelab.loadgen")
PATH = "/v1/traces"
MAX_PENDING_SPANS = 50_000    # waiting for the database; an H200 at 128 users makes ~100/s
MAX_UPLOAD_BYTES = 16 << 20   # one export as sent (compressed)
SPAN_WAIT_S = float(os.environ.get("SERVELAB_SPAN_WAIT_S", 6.0))
# Where the receiver listens: 127.0.0.1 unless this says otherwise, which only Compose does (its
# master is a container the server reaches by service name: orchestration/otlp.py).
HOST_ENV = "SERVELAB_OTLP_HOST"


def _missing_sql(run_id: str) -> tuple[str, list]:
    return ("SELECT count(*) FROM requests r WHERE r.run_id = ? AND r.error_kind IS NULL AND "
            "r.sent_unix IS NOT NULL AND NOT EXISTS (SELECT 1 FROM server_spans s WHERE "
            "s.run_id = r.run_id AND s.request_id = r.request_id)", [run_id])


class SpanIntake:
    """Listens from construction (``port`` 0: a free one) until ``close``; stores what arrives
    while a run is on (``begin`` .. ``end``)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1",
                 max_pending: int = MAX_PENDING_SPANS, clock=time.time, collector=None):
        self.collector = collector   # whose run (run_id, writer, active) spans belong to
        self._ended: str | None = None
        self.max_pending = max_pending
        self.clock = clock
        self.run_id: str | None = None
        self.writer = None
        self._seen: set[str] = set()
        self._queued: dict[int, int] = {}   # export number -> spans, until the writer ran it
        self._ran: deque = deque()          # export numbers, appended by the database thread
        self._export_no = 0
        self.counts = dict.fromkeys(("exports", "spans", "stored_calls", "dropped",
                                     "duplicates", "refused", "outside_run", "other_spans"), 0)
        self.last_problem: str | None = None
        self.server = WSGIServer((host, port), self._app, log=None, error_log=None)
        self.server.start()
        self.port = self.server.server_port
        self.endpoint = f"http://{host}:{self.port}{PATH}"

    # ---- the run ------------------------------------------------------------------------
    def begin(self, run_id: str, writer) -> None:
        self.run_id, self.writer = run_id, writer
        self._seen = set()
        self._queued.clear()
        self._ran.clear()
        for k in self.counts:
            self.counts[k] = 0
        self.last_problem = None

    def end(self) -> None:
        self._ended = self.run_id
        self.run_id, self.writer = None, None

    def finish(self) -> list[str]:
        """The run is ending: wait for its last spans, stop storing, return its notes."""
        self._follow()
        self.settle()
        run_id = self.run_id
        self.end()
        # The decoder's own notes (SGLang: phases it has no slice for, rows whose slices had
        # not come) belong to the run beside the receiver's counts.
        return self.notes() + spans.notes(run_id)

    def _follow(self) -> None:
        """Begin the collector's run when it has one this intake has not seen."""
        c = self.collector
        if c is not None and c.active and c.writer is not None and \
                c.run_id not in (self.run_id, self._ended):
            self.begin(c.run_id, c.writer)

    def pending(self) -> int:
        """Spans handed to the writer that it has not run yet."""
        while self._ran:
            self._queued.pop(self._ran.popleft(), None)
        return sum(self._queued.values())

    def settle(self, timeout_s: float = SPAN_WAIT_S) -> None:
        """Wait for the spans of completed requests that have none yet (only when this server
        sends spans at all), at most ``timeout_s``; the writer commits what came."""
        if self.writer is None or not self.counts["spans"]:
            return
        deadline = time.monotonic() + timeout_s
        sql, params = _missing_sql(self.run_id)
        while True:
            self.writer.wait_idle(5.0)
            missing = self.writer.run_now(lambda store: store.con.execute(sql, params)
                                          .fetchone()[0])
            if not missing or time.monotonic() >= deadline:
                return
            gevent.sleep(0.25)

    def notes(self) -> list[str]:
        """The run's notes on spans that were not stored as they came."""
        c, out = self.counts, []
        if c["dropped"]:
            out.append(f"server spans: {c['dropped']} of {c['spans']} dropped (more than "
                       f"{self.max_pending} waited for the database); no request row was lost "
                       "for it, those requests have no phases")
        if c["refused"]:
            out.append(f"server spans: {c['refused']} export(s) refused ({self.last_problem})")
        if c["outside_run"]:
            out.append(f"server spans: {c['outside_run']} arrived between runs, not stored")
        return out

    def status(self) -> dict:
        return {"endpoint": self.endpoint, "pending": self.pending(), **self.counts}

    def close(self) -> None:
        self.server.stop(timeout=1)

    # ---- one export (event loop) ----------------------------------------------------------
    def _app(self, environ, start_response):
        if environ.get("PATH_INFO") != PATH:
            return _answer(start_response, "404 Not Found", b"", "text/plain")
        if environ.get("REQUEST_METHOD") != "POST":
            return _answer(start_response, "405 Method Not Allowed", b"", "text/plain")
        ctype = environ.get("CONTENT_TYPE") or spans.PROTOBUF
        as_json = ctype.split(";")[0].strip().lower() == spans.JSON
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_UPLOAD_BYTES:
            self._problem(f"Content-Length {environ.get('CONTENT_LENGTH')!r}: allowed up to "
                          f"{MAX_UPLOAD_BYTES} bytes")
            return _answer(start_response, "413 Payload Too Large",
                           _status_body(self.last_problem, as_json), ctype)
        body = environ["wsgi.input"].read(length) if length else b""
        encoding = environ.get("HTTP_CONTENT_ENCODING")
        try:
            rejected, why = self.accept(body, ctype, encoding)
        except spans.SpanBodyError as exc:
            self._problem(str(exc))
            return _answer(start_response, "400 Bad Request", _status_body(str(exc), as_json),
                           ctype)
        return _answer(start_response, "200 OK", _success_body(rejected, why, as_json), ctype)

    def accept(self, body: bytes, ctype: str, encoding: str | None) -> tuple[int, str]:
        """Store or drop one export; (spans rejected, why). Raises SpanBodyError."""
        self._follow()
        self.counts["exports"] += 1
        run_id, writer = self.run_id, self.writer
        decoded = spans.decode_export(body, ctype, run_id, self.clock(), encoding)
        rows, c = decoded.rows, self.counts
        c["other_spans"] += decoded.other_spans
        if writer is None:
            c["outside_run"] += len(rows)
            return len(rows), "servelab: no run is on; spans are stored during runs only"
        c["spans"] += len(rows)
        if rows and self.pending() + len(rows) > self.max_pending:
            c["dropped"] += len(rows)
            if c["dropped"] == len(rows):
                log.warning("servelab: %d server spans wait for the database; dropping exports "
                            "(counted in the run's notes)", self.pending())
            return len(rows), f"servelab: more than {self.max_pending} spans wait for storage"
        for row in rows:
            if row.server_request_id in self._seen:
                row.duplicate = True
                c["duplicates"] += 1
            else:
                self._seen.add(row.server_request_id)
        if rows:
            self._export_no += 1
            number, ran = self._export_no, self._ran
            self._queued[number] = len(rows)

            def store_spans(store) -> None:   # the database thread
                try:
                    store.append_rows("server_spans", rows)
                finally:
                    ran.append(number)
            writer.call(store_spans)
        return 0, ""

    def _problem(self, text: str) -> None:
        self.counts["refused"] += 1
        if self.last_problem is None:
            log.warning("servelab: an OTLP export was refused: %s", text)
        self.last_problem = text[:300]


def _answer(start_response, status: str, body: bytes, ctype: str):
    kind = spans.JSON if ctype.split(";")[0].strip().lower() == spans.JSON else spans.PROTOBUF
    start_response(status, [("Content-Type", kind if body or status[0] != "4" else "text/plain"),
                            ("Content-Length", str(len(body)))])
    return [body]


def _success_body(rejected: int, why: str, as_json: bool) -> bytes:
    """ExportTraceServiceResponse; partial_success when spans were rejected."""
    if as_json:
        import orjson

        return orjson.dumps({"partialSuccess": {"rejectedSpans": str(rejected),
                                                "errorMessage": why}} if rejected else {})
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import \
        ExportTraceServiceResponse

    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = why
    return resp.SerializeToString()


def _status_body(message: str, as_json: bool) -> bytes:
    """google.rpc.Status, as OTLP/HTTP answers a failure (code 3: INVALID_ARGUMENT)."""
    if as_json:
        import orjson

        return orjson.dumps({"code": 3, "message": message})
    # google.rpc.Status {code = 1 (varint), message = 2 (string)}, written out: its generated
    # module is not part of opentelemetry-proto
    text = message.encode()[:16000]
    n, size = len(text), b""
    while True:
        size += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            break
    return b"\x08\x03\x12" + size + text



class NoSpans:
    """No receiver (``--otlp-port`` -1 or unset): the collector's hooks do nothing."""
    endpoint = None

    def finish(self) -> list[str]:
        return []


def attach(collector, environment) -> SpanIntake | NoSpans:
    """The receiver ``--otlp-port`` asks for (0: a free port), following ``collector``'s runs
    and closed when Locust quits. A port that is taken is said once and the runs go on without
    spans."""
    port = getattr(environment.parsed_options, "otlp_port", -1)
    if port is None or port < 0:
        return NoSpans()
    host = os.environ.get(HOST_ENV) or "127.0.0.1"
    try:
        intake = SpanIntake(port, host=host, collector=collector)
    except OSError as exc:
        log.error("servelab: --otlp-port %d: cannot listen on %s (%s); the run goes on "
                  "without the server's spans (give a free port, or 0)", port, host,
                  exc.strerror)
        return NoSpans()
    environment.events.quitting.add_listener(lambda **_kw: intake.close())
    log.info("servelab: receiving the server's OTLP spans at %s", intake.endpoint)
    return intake
