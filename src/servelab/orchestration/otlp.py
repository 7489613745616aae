"""What a server servelab starts is told so that it sends its per-request spans (OTLP/HTTP) to
the run's receiver (``loadgen/master/spans_intake``): the flag, the environment, and which server
kinds send spans servelab reads (vLLM's ``llm_request``; SGLang's request tree, decoded by
store/spans_sglang.py). A kind whose package names ``TRACING`` (SGLang: its ``tracing`` module)
is told in its own flags and environment; the others in vLLM's ``FLAG``.

The receiver's port is fixed before either side starts (the server needs the address first):
``--backend local`` and the simulator pick a free one, given to the server and to the run. In
Compose the run's master is a container: the server reaches it by service name on
``COMPOSE_PORT``, and the master listens on the container's interfaces there (``HOST_ENV``), as
its web UI does; everywhere else the receiver listens on 127.0.0.1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from servelab.specs.server_kinds import tracing_of

FLAG = "--otlp-traces-endpoint"
PATH = "/v1/traces"
COMPOSE_PORT = 4318            # OTLP/HTTP's own port, inside the Compose network only
HOST_ENV = "SERVELAB_OTLP_HOST"   # where the master's receiver listens (default 127.0.0.1)
ENDPOINT_ENV = "SERVELAB_OTLP_ENDPOINT"   # Compose: overrides where a server sends its spans
# OTLP/HTTP protobuf, the format the receiver decodes; a batch every 0.5 s (OpenTelemetry's
# BatchSpanProcessor waits 5 s by default), so a run's last spans come soon after its end.
SERVER_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
              "OTEL_BSP_SCHEDULE_DELAY": "500"}
SPAN_KINDS = ("vllm", "sglang")   # server kinds whose spans request_phases reads


@dataclass(frozen=True)
class SpanExport:
    """How one kind is told where its spans go: ``[*switches, flag, url]`` and ``env``."""
    flag: str = FLAG
    switches: tuple[str, ...] = ()
    env: dict = field(default_factory=lambda: dict(SERVER_ENV))


def span_export(kind) -> SpanExport:
    """The kind's own (its package's ``TRACING``: ``SWITCHES``, ``ENDPOINT_FLAG``, ``ENV``),
    else vLLM's flag and SERVER_ENV."""
    tracing = tracing_of(kind)
    if tracing is None:
        return SpanExport()
    return SpanExport(tracing.ENDPOINT_FLAG, tuple(tracing.SWITCHES),
                      {**SERVER_ENV, **tracing.ENV})


def server_env(kind) -> dict:
    """The environment a server of ``kind`` sending spans needs (SERVER_ENV and its own)."""
    return span_export(kind).env


def endpoint(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}{PATH}"


def sends_spans(variant) -> bool:
    """Whether the variant's servers get the flag: a kind whose spans servelab reads, one role
    per request (a prefill/decode pair would send two spans for each request, and the phases
    would mix the roles')."""
    return variant.kind.name in SPAN_KINDS and variant.pd is None


def server_args(variant, url: str | None) -> list[str]:
    """The kind's flags for ``url``, unless the variant's own arguments already set the endpoint
    (theirs wins); a switch the variant already gives is not repeated."""
    if not url or not sends_spans(variant):
        return []
    export = span_export(variant.kind)
    if export.flag in variant.serve_args:
        return []
    return [*(s for s in export.switches if s not in variant.serve_args), export.flag, url]


def kind_name(server_kind: str | None, variant: str | None) -> str:
    """The target's kind: --server-kind, else the variant's (a variant name that is only a
    label, or none: vLLM)."""
    if server_kind:
        return server_kind
    from servelab.core.errors import ServelabError
    from servelab.specs.variants import load_variant

    try:
        return load_variant(variant).kind.name if variant else "vllm"
    except ServelabError:
        return "vllm"


def told(port: int, kind_name: str = "vllm") -> str:
    """What a server of that kind is given to send its spans to a receiver on ``port``: the
    line `servelab run --target` prints."""
    from servelab.specs.server_kinds import server_kind

    export = span_export(server_kind(kind_name))
    env = " ".join(f"{k}={v}" for k, v in export.env.items())
    flags = " ".join((*export.switches, export.flag, endpoint(port)))
    return (f"{flags} and the environment {env} (a batch every 0.5 s; servelab run "
            f"--otlp-port {port} keeps this port)")
