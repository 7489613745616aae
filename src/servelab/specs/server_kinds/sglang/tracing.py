"""How SGLang is told to send its request traces to the run's receiver (``orchestration/otlp.py``
reads these through the kind's package, ``TRACING``; the spans are decoded by
``store/spans_sglang.py``).

From SGLang 0.5.23's source (0.5.21's is the same):
  - arg_groups/fields/observability.py: ``--enable-trace`` (off by default) turns tracing on;
    ``--otlp-traces-endpoint`` (default ``localhost:4317``) is where spans go; no other check.
  - observability/trace.py ``get_otlp_span_exporter``: the protocol is
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, default ``grpc``; ``http/protobuf`` gives the HTTP
    exporter with the endpoint used as it is (a whole URL, ``.../v1/traces``), which is what the
    receiver speaks. ``process_tracing_init``: a BatchSpanProcessor per process, every
    ``SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS`` (500) or 64 spans
    (``SGLANG_OTLP_EXPORTER_MAX_EXPORT_BATCH_SIZE``); OpenTelemetry's own OTEL_BSP_* are not read.
  - ``SGLANG_TRACE_LEVEL`` (default 3) drops slices above it: level 3 adds a ``decode_loop``
    span per decode step and request, level 2 a ``spec_draft`` span per step with speculative
    decoding; level 1 keeps the root, the thread spans and every slice servelab reads
    (prefill_waiting, prefill_forward), about eight spans per request, so SGLang's span queue
    (2,048 by default) does not overflow under load and drop a request's spans.
"""
from __future__ import annotations

SWITCHES = ("--enable-trace",)              # given before the endpoint flag
ENDPOINT_FLAG = "--otlp-traces-endpoint"    # followed by the receiver's URL
ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
       "SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS": "500",
       "SGLANG_TRACE_LEVEL": "1"}
# SGLang names a request by its body's ``rid`` (managers/io_struct.py GenerateReqInput.rid,
# passed on by entrypoints/openai/serving_chat.py and serving_completions.py; chat also takes
# the X-Override-Rid header, entrypoints/request_headers.py), else a uuid4 hex; it does not read
# X-Request-Id. The root span's gen_ai.request.id is that rid: servelab's id must be sent here
# for a span to join its request (the client does not send it yet).
REQUEST_ID_FIELD = "rid"
