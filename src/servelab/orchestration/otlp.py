"""What a server servelab starts is told so that it sends its per-request spans (OTLP/HTTP) to
the run's receiver (``loadgen/master/spans_intake``): the flag, the environment, and which server
kinds send spans servelab reads (vLLM's ``llm_request``; SGLang's tracing is another format:
docs/server_telemetry.md maps it).

The receiver's port is fixed before either side starts (the server needs the address first):
``--backend local`` and the simulator pick a free one, given to the server and to the run. In
Compose the run's master is a container: the server reaches it by service name on
``COMPOSE_PORT``, and the master listens on the container's interfaces there (``HOST_ENV``), as
its web UI does; everywhere else the receiver listens on 127.0.0.1.
"""
from __future__ import annotations

FLAG = "--otlp-traces-endpoint"
PATH = "/v1/traces"
COMPOSE_PORT = 4318            # OTLP/HTTP's own port, inside the Compose network only
HOST_ENV = "SERVELAB_OTLP_HOST"   # where the master's receiver listens (default 127.0.0.1)
ENDPOINT_ENV = "SERVELAB_OTLP_ENDPOINT"   # Compose: overrides where a server sends its spans
# OTLP/HTTP protobuf, the format the receiver decodes; a batch every 0.5 s (OpenTelemetry's
# BatchSpanProcessor waits 5 s by default), so a run's last spans come soon after its end.
SERVER_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
              "OTEL_BSP_SCHEDULE_DELAY": "500"}
SPAN_KINDS = ("vllm",)         # server kinds whose spans request_phases reads


def endpoint(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}{PATH}"


def sends_spans(variant) -> bool:
    """Whether the variant's servers get the flag: a kind whose spans servelab reads, one role
    per request (a prefill/decode pair would send two spans for each request, and the phases
    would mix the roles')."""
    return variant.kind.name in SPAN_KINDS and variant.pd is None


def server_args(variant, url: str | None) -> list[str]:
    """The flag for ``url``, unless the variant's own arguments already set one (theirs wins)."""
    if not url or not sends_spans(variant) or FLAG in variant.serve_args:
        return []
    return [FLAG, url]
