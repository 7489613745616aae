"""aiohttp handlers for vLLM's OpenAI-compatible endpoints and the simulator's own ones."""
from __future__ import annotations

import asyncio
import time
import uuid

import orjson
from aiohttp import web

from servelab import __version__
from servelab.core.chatml import ChatTemplateError, render_chat
from servelab.sim.server.faults import HTTP_KINDS
from servelab.sim.server.protocol import (
    ApiError,
    ChunkFormat,
    chat_response,
    completion_response,
    models_response,
    parse_body,
    parse_generate,
    prompt_input,
    resolve_model,
)
from servelab.sim.server.realtime import ENGINE_DEAD_MESSAGE, pick_driver
from servelab.sim.server.stream import RequestStream, ServerRecord, clock

SIM = web.AppKey("sim", object)
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True,
               "false": False, "0": False, "no": False, "off": False}  # FastAPI's bool query values
# prometheus_fastapi_instrumentator as vLLM sets it up: these handlers are not counted.
UNCOUNTED_HANDLERS = frozenset(("/metrics", "/health", "/load", "/ping", "/version",
                                "/server_info"))
STREAM_STARTED = web.RequestKey("stream_started", bool)
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_FAULT_STATUS = {
    "http429": (429, "RateLimitError", "Too many requests: rate limit reached (injected fault)."),
    "http500": (500, "InternalServerError", "Internal server error (injected fault)."),
    "http503": (503, "ServiceUnavailableError", "The server is overloaded or not ready yet."),
}


def json_response(body: bytes, status: int = 200, headers=None) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json",
                        headers=headers)


def error_response(exc: ApiError, headers=None) -> web.Response:
    return json_response(exc.body(), exc.status, headers)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    sim = request.app[SIM]
    try:
        sreq, arrival = await _parse(request, kind, sim)
    except ApiError as exc:
        return error_response(exc)
    rec = _record(request, kind, sreq, arrival)
    fault = sim.fault_plan.draw()
    if fault is not None and fault.kind in HTTP_KINDS:
        return _refuse(sim, rec, fault.kind)
    router = sim.pd   # a PD variant: the proxy's legs (``pd``); None: colocated engines
    driver = pick_driver(sim.drivers if router is None else router.decode)
    if driver is None:
        return error_response(ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError"))
    text, eos_after = sim.output_text(sreq)
    created = int(time.time())
    stream = _request_stream(sim, kind, sreq, rec, text, created, driver)
    if fault is not None and sreq.stream:
        expected = sreq.max_tokens if eos_after is None else min(eos_after, sreq.max_tokens)
        stream.set_fault(fault, expected, sim.fault_plan.spec.stall_s)
    resp = None
    try:
        if router is not None and not await router.run_prefill(stream, sreq.prompt_ids,
                                                                request.path):
            return _engine_dead(sim, rec)
        if sreq.stream:
            resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            request[STREAM_STARTED] = True  # the status line (200) is out, whatever happens next
            stream.transport = request.transport
        if router is not None:
            driver = await router.hand_off(stream, len(sreq.prompt_ids), request.path)
            if driver is None:
                stream.fail(ENGINE_DEAD_MESSAGE, clock())
                sim.add_record(rec)
                return resp or _engine_dead(sim, None)
        driver.submit(stream, sreq.prompt_ids, sreq.max_tokens, sreq.min_tokens, sreq.ignore_eos,
                      eos_after, sim.spec_acceptance_hint(sreq.prompt_ids))
        await stream.done
    except asyncio.CancelledError:
        if stream.abort_cb is None and rec.finish_reason is None:
            sim.add_record(rec)  # gone before an engine had it: no driver records it
        stream.cancel(clock())
        raise
    if resp is not None:
        return resp
    if rec.error == "engine dead":
        return error_response(ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError"))
    return _whole_response(sim, kind, sreq, rec, text, created)


async def _parse(request: web.Request, kind: str, sim):
    """The request, validated and tokenized, and when it arrived; raises ApiError."""
    raw = await request.read()
    arrival = clock()  # as vLLM: arrived once the body is in (a slow upload is not queueing)
    body = parse_body(raw)
    resolve_model(body, sim.served)
    prompt = prompt_input(kind, body, sim.tokenizer.vocab_size)
    prompt_ids = await sim.encode(prompt) if isinstance(prompt, str) else prompt
    return parse_generate(kind, body, prompt_ids, sim.served), arrival


def _record(request: web.Request, kind: str, sreq, arrival: float) -> ServerRecord:
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    internal = uuid.uuid4().hex
    # As vLLM's serving code (_base_request_id): the caller's X-Request-Id names the response,
    # so client rows and server records join on it; otherwise a random id.
    header_id = request.headers.get("X-Request-Id")
    request_id = prefix + (internal if header_id is None else header_id)
    return ServerRecord(request_id, kind, sreq.model, arrival, sreq.stream,
                        len(sreq.prompt_ids), sreq.max_tokens, x_request_id=header_id,
                        engine_id=prefix + internal)


def _refuse(sim, rec: ServerRecord, fault: str) -> web.Response:
    """An injected HTTP error instead of an answer; the record keeps it."""
    status, err_type, message = _FAULT_STATUS[fault]
    rec.status, rec.fault, rec.error = status, fault, message
    rec.finished = clock()
    sim.add_record(rec)
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return error_response(ApiError(status, message, err_type), headers)


def _request_stream(sim, kind: str, sreq, rec: ServerRecord, text, created: int,
                    driver) -> RequestStream:
    fmt = None
    if sreq.stream:
        fmt = ChunkFormat(kind, rec.request_id, sreq.model, created, len(sreq.prompt_ids),
                          sreq.continuous_usage)
    return RequestStream(rec, text, fmt, sim.tokenizer.token_json, driver.metrics,
                         sreq.include_usage or sim.force_include_usage, sim.prompt_tokens_details,
                         asyncio.get_running_loop())


def _whole_response(sim, kind: str, sreq, rec: ServerRecord, text, created: int) -> web.Response:
    """A non-streaming answer: the whole text, rendered once the engine finished it."""
    body_text = "".join(sim.tokenizer.token_text[i] for i in text.ids(0, rec.output_tokens))
    cached = rec.cached_tokens if sim.prompt_tokens_details else None
    build = chat_response if kind == "chat" else completion_response
    return json_response(build(rec.request_id, sreq.model, created, body_text,
                               rec.finish_reason, rec.prompt_tokens, rec.output_tokens, cached))


def _engine_dead(sim, rec: ServerRecord | None) -> web.Response:
    """500 before any byte of the answer went out; the record, if given, is kept."""
    if rec is not None:
        rec.status, rec.error, rec.finished = 500, "engine dead", clock()
        sim.add_record(rec)
    return error_response(ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError"))


async def models(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    return json_response(models_response(sim.served, sim.created))


async def health(request: web.Request) -> web.Response:
    dead = any(d.dead is not None for d in request.app[SIM].drivers)
    return web.Response(status=503 if dead else 200)


async def version(request: web.Request) -> web.Response:
    return json_response(orjson.dumps({"version": f"servelab-sim-{__version__}"}))


async def metrics(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    if sim.pd is not None:  # the toy proxy has no /metrics; each instance serves its own
        return json_response(b'{"detail":"Not Found"}', 404)
    return web.Response(body=sim.exporter.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def tokenize(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    try:
        body = parse_body(await request.read())
        resolve_model(body, sim.served)
        if "messages" in body:
            try:
                text = render_chat(body["messages"], bool(body.get("add_generation_prompt", True)))
            except ChatTemplateError as exc:
                raise ApiError(400, str(exc), param="messages") from None
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise ApiError(400, "Give 'prompt' (a string) or 'messages' (a chat)", param="prompt")
    except ApiError as exc:
        return error_response(exc)
    ids = await sim.encode(text)
    strs = sim.tokenizer.token_strs(ids) if body.get("return_token_strs") else None
    return json_response(orjson.dumps({"count": len(ids), "max_model_len": sim.served.max_model_len,
                                       "tokens": ids, "token_strs": strs}))


async def detokenize(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    try:
        body = parse_body(await request.read())
        resolve_model(body, sim.served)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ApiError(400, "'tokens' must be a list of token ids", param="tokens")
        bad = [t for t in tokens if not 0 <= t < sim.tokenizer.vocab_size]
        if bad:
            raise ApiError(400, f"Token id {bad[0]} is out of vocabulary", param="tokens")
    except ApiError as exc:
        return error_response(exc)
    return json_response(orjson.dumps({"prompt": sim.tokenizer.decode(tokens)}))


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's development endpoint: 200 with an empty body whether or not every engine could
    reset (vLLM does not check either; a refusal is logged, as vLLM's engine logs it)."""
    sim = request.app[SIM]
    flag = request.query.get("reset_running_requests", "false").lower()
    if flag not in _BOOL_WORDS:
        return error_response(ApiError(400, f"reset_running_requests: found {flag!r}; allowed "
                                            "true or false", param="reset_running_requests"))
    sim.reset_prefix_cache(_BOOL_WORDS[flag])
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    """SGLang's /flush_cache (entrypoints/http_server.py, GET or POST, not a development
    endpoint): empties the prefix cache, or answers 400 while requests still run."""
    if request.app[SIM].reset_prefix_cache(False):
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation "
                                 "will not be performed.)\n")
    return web.Response(status=400, text="Cache not flushed: requests are running.\n")


async def sim_requests(request: web.Request) -> web.Response:
    """Finished requests in finishing order: ``?since=EPOCH`` (finished at or after),
    ``?cursor=SEQ`` (seq greater than), ``?limit=N``."""
    sim = request.app[SIM]
    q = request.query
    try:
        # times are served rounded to the microsecond; compare at that precision
        since = float(q["since"]) - sim.epoch_offset - 1e-6 if "since" in q else None
        cursor = int(q.get("cursor", 0))
        limit = int(q.get("limit", 0)) or None
    except ValueError:
        return error_response(ApiError(400, "since must be a number (Unix seconds); cursor and "
                                            "limit whole numbers"))
    out = []
    for rec in sim.records_after(cursor):
        if since is not None and (rec.finished or 0) < since:
            continue
        out.append(rec.as_dict(sim.epoch_offset))
        if limit is not None and len(out) >= limit:
            break
    next_cursor = out[-1]["seq"] if out else cursor
    return json_response(orjson.dumps({"requests": out, "next_cursor": next_cursor,
                                       "in_flight": sum(d.outstanding for d in sim.drivers)}))


@web.middleware
async def count_http_requests(request: web.Request, handler):
    """``http_requests_total{handler,method,status}``: the route template, the method and the
    status class of the status line sent (500 when none was, as the instrumentator counts)."""
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        if request.get(STREAM_STARTED):
            status = 200
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else "none"
        if path not in UNCOUNTED_HANDLERS:
            key = (path, request.method, f"{status // 100}xx")
            counts = request.app[SIM].http_requests
            counts[key] = counts.get(key, 0) + 1


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/sim/requests", sim_requests)
    if app[SIM].dev_mode:
        app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    if app[SIM].kind.reset_prefix_cache_path == "/flush_cache":  # SGLang's, not dev-only
        app.router.add_route("*", app[SIM].kind.reset_prefix_cache_path, flush_cache)
