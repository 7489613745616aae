"""The hostile kit's other endpoints: every one servelab reads besides the stream (``/metrics``,
``/v1/models``, ``/tokenize`` and ``/detokenize``, ``/version``, ``/health``), each able to answer
every hostile variant of ``VARIANTS``: an HTML login page, JSON of the wrong shape, an empty body,
a body cut short, 50 MB, a 10 s trickle, a 500, a wrong Content-Type, a reset connection, and for
``/metrics`` also text the Prometheus parser refuses, NaN/Inf values, a repeated series and
OpenMetrics text.

A request picks its variant with the header ``ROUTES[path].header`` (``X-Hostile-Metrics`` for
``/metrics``...), or with a base URL ``http://HOST:PORT/v/VARIANT`` (hostile_server.py); a
comma-separated list is rotated, one item per request to that endpoint (so a ``servelab run
--header 'X-Hostile-Metrics: a,b,c'`` meets each in turn, a scrape each). Without
the header an endpoint answers as the kit always did (``/v1/models`` sane, ``/metrics`` and
``/tokenize`` 404, ``/version`` and ``/health`` sane). ``EXPECTED[path][variant]`` is the outcome
servelab names for it (``core.bounded_http.OUTCOMES``, ``loadgen.master.scraper.OUTCOMES``).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from hostile_wire import Conn, chunked, head

MODEL = "hostile"
SLOW_S = 10.0                # the slow variant's whole answer, trickled
LARGE = 50 << 20             # the too-large variant's body
LOGIN = (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><form action="
         b"\"/login\" method=\"post\"><input name=\"user\"><input name=\"password\" "
         b"type=\"password\"></form></body></html>\n")


def metrics_page(n: int, extra: str = "") -> bytes:
    """A small vLLM page (two engines): what the live view and server_metrics read."""
    lines = ["# HELP vllm:num_requests_running Requests running.",
             "# TYPE vllm:num_requests_running gauge"]
    for e in (0, 1):
        lab = f'{{engine="{e}",model_name="{MODEL}"}}'
        lines += [f"vllm:num_requests_running{lab} {1 + e}",
                  f"vllm:num_requests_waiting{lab} 0",
                  f"vllm:kv_cache_usage_perc{lab} {0.25 + 0.125 * e}",
                  f"vllm:generation_tokens_total{lab} {40.0 * n + e}"]
    return ("\n".join(lines) + "\n" + extra).encode()


OPENMETRICS = (b"# TYPE vllm:num_requests_running gauge\n"
               b'vllm:num_requests_running{engine="0"} 2.0\n'
               b"# TYPE vllm:generation_tokens counter\n"
               b'vllm:generation_tokens_total{engine="0"} 17.0 # {trace_id="kit"} 1.0 1.5\n'
               b'vllm:generation_tokens_created{engine="0"} 1.7e9\n'
               b"# EOF\n")


@dataclass
class Route:
    header: str            # the request header that picks the variant
    default: str           # the variant without it
    sane_type: str | None  # the sane answer's Content-Type


ROUTES = {
    "/metrics": Route("x-hostile-metrics", "absent", "text/plain; version=0.0.4; charset=utf-8"),
    "/v1/models": Route("x-hostile-models", "sane", "application/json"),
    "/tokenize": Route("x-hostile-tokenize", "absent", "application/json"),
    "/detokenize": Route("x-hostile-tokenize", "absent", "application/json"),
    "/version": Route("x-hostile-version", "sane", "application/json"),
    "/health": Route("x-hostile-health", "sane", None),
}


def _text_of(body: dict) -> tuple[str, int]:
    """The text /tokenize counts, and the chat template's own tokens (the kit's: 3 a message)."""
    if "messages" in body:
        msgs = body["messages"]
        return "".join(m.get("content") or "" for m in msgs), 3 * len(msgs) + 3
    return body.get("prompt", ""), 0


def sane(path: str, body: dict, n: int) -> bytes:
    """The right answer: one token per UTF-8 byte, so /detokenize inverts /tokenize."""
    if path == "/metrics":
        return metrics_page(n)
    if path == "/v1/models":
        return json.dumps({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "hostile"}]}).encode()
    if path == "/tokenize":
        text, extra = _text_of(body)
        tokens = list(text.encode()) + [1] * extra
        return json.dumps({"count": len(tokens), "tokens": tokens,
                           "max_model_len": 4096}).encode()
    if path == "/detokenize":
        return json.dumps({"prompt": bytes(t for t in body.get("tokens", []) if t < 256)
                           .decode("utf-8", "replace")}).encode()
    if path == "/version":
        return b'{"version": "0.0.0-hostile"}'
    return b""   # /health: vLLM's 200 with an empty body


async def trickle(c: Conn, data: bytes, over_s: float = SLOW_S):
    """The whole answer a few bytes at a time over ``over_s``: no per-read timeout catches it."""
    step = max(1, len(data) // 200)
    for i in range(0, len(data), step):
        await c.send(data[i:i + step])
        await asyncio.sleep(over_s * step / len(data))


async def large(c: Conn, ctype: bytes, line: bytes):
    await c.send(ctype + b"Transfer-Encoding: chunked\r\n\r\n")
    block = line * ((1 << 20) // len(line))
    sent = 0
    while sent < LARGE:   # the client hangs up at its cap: the write then fails
        await c.send(chunked([block]))
        sent += len(block)
    await c.send(b"0\r\n\r\n")


async def answer(c: Conn, path: str, variant: str, body: dict, n: int):
    route = ROUTES[path]
    good = sane(path, body, n)
    ok_head = head("200 OK", route.sane_type)
    if variant == "absent":
        return await c.fixed(b"not found", head("404 Not Found", "text/plain"))
    if variant == "sane":
        return await c.fixed(good, ok_head)
    if variant == "html_page":
        return await c.fixed(LOGIN, head("200 OK", "text/html; charset=utf-8"))
    if variant == "json_body":
        return await c.fixed(b'{"object": "error", "message": "hostile", "data": "none"}',
                             head("200 OK", "application/json"))
    if variant == "empty":
        return await c.fixed(b"", ok_head)
    if variant == "truncated":
        await c.fixed(good or b"{", ok_head, length=2 * len(good) + 10)
        c.close = True
        return None
    if variant == "too_large":
        line = b"# filler line of a page that never ends\n" if path == "/metrics" else b"0,"
        return await large(c, ok_head, line)
    if variant == "slow":
        return await trickle(c, ok_head + b"Content-Length: %d\r\n\r\n" % len(good) + good)
    if variant == "http_500":
        return await c.fixed(b"<html><body>Internal Server Error</body></html>",
                             head("500 Internal Server Error", "text/html"))
    if variant == "wrong_content_type":
        return await c.fixed(good, head("200 OK", "application/octet-stream"))
    if variant == "connection_cut":
        return c.reset()
    return await _special(c, path, variant, n)


async def _special(c: Conn, path: str, variant: str, n: int):
    text = head("200 OK", "text/plain; version=0.0.4")
    if variant == "not_prometheus":
        return await c.fixed(b"this is not prometheus text {\n", text)
    if variant == "nan_inf":
        extra = 'vllm:kv_cache_usage_perc{engine="2"} NaN\nvllm:spec_decode_x +Inf\n'
        return await c.fixed(metrics_page(n, extra), text)
    if variant == "duplicate_series":
        extra = f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 7\n'
        return await c.fixed(metrics_page(n, extra), text)
    if variant == "openmetrics":
        return await c.fixed(OPENMETRICS, head(
            "200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8"))
    if variant == "not_json":
        return await c.fixed(b"hello {", head("200 OK", "application/json"))
    if variant == "no_model":
        return await c.fixed(b'{"object": "list", "data": []}', head("200 OK",
                                                                      "application/json"))
    raise ValueError(f"{path}: no hostile variant {variant!r}")


GENERIC = ("sane", "html_page", "json_body", "empty", "truncated", "too_large", "slow",
           "http_500", "wrong_content_type", "connection_cut")
_TRANSPORT = {"sane": "ok", "html_page": "html_page", "truncated": "truncated",
              "too_large": "too_large", "slow": "timeout", "http_500": "http_500",
              "connection_cut": "connection_reset", "empty": "empty",
              "wrong_content_type": "wrong_content_type"}
_JSON = {**_TRANSPORT, "json_body": "wrong_shape", "not_json": "not_json"}
# variant -> the outcome servelab names (metrics: quirks are stored pages, named in the notes)
EXPECTED = {
    "/metrics": {**_TRANSPORT, "json_body": "json_body", "not_prometheus": "not_prometheus",
                 "nan_inf": "nan_inf_nulled", "duplicate_series": "duplicate_series",
                 "openmetrics": "openmetrics_ok"},
    "/v1/models": {**_JSON, "no_model": "no_model"},
    "/tokenize": dict(_JSON),
    "/version": dict(_JSON),
    # a health check reads the status: an empty or JSON 200 is healthy, so is any Content-Type
    "/health": {**_TRANSPORT, "json_body": "ok", "empty": "ok", "wrong_content_type": "ok"},
}
VARIANTS = {path: tuple(v) for path, v in EXPECTED.items()}


class Rotation:
    """Which variant each request gets: the header's list, one item per request, in turn."""

    def __init__(self):
        self.turns: dict[tuple[str, str], int] = {}
        self.served: dict[str, dict[str, int]] = {}

    def pick(self, path: str, fields: dict) -> tuple[str, int]:
        route = ROUTES[path]
        value = fields.get(route.header, route.default)
        items = [v.strip() for v in value.split(",") if v.strip()] or [route.default]
        key = (route.header, value)
        n = self.turns.get(key, 0)
        self.turns[key] = n + 1
        variant = items[n % len(items)]
        per = self.served.setdefault(path, {})
        per[variant] = per.get(variant, 0) + 1
        return variant, n
