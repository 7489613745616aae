"""A fixed-timing OpenAI-style SSE server: the yardstick for the load generator itself.

Every stream gets its first content chunk ``--ttft-ms`` after the request arrived and one chunk
every ``--itl-ms`` after that, whatever the load, so any spread a client measures beyond that is
the client's (or this server's, which ``bench/loadgen.py`` checks with a raw-socket reference
client). Chunks have vLLM's shapes (role-only first chat chunk, per-chunk usage when
``continuous_usage_stats`` is asked, a final usage chunk, ``[DONE]``).

Faults speak the simulator's grammar (``servelab sim --faults``, ``sim.server.faults``) and strike
where the simulator's would: ``--faults SPEC --seed N`` draws one per request in arrival order,
and a request may carry its own spec in the ``X-Servelab-Faults`` header (drawn with its request
id as the seed, so a test knows the outcome: ``fault_chunk`` below; with ``cut=1`` the request is
cut, at the chunk ``fault_chunk`` names). ``--reject-continuous`` answers 400 to
``continuous_usage_stats`` like an older server; ``--no-metrics`` makes ``/metrics`` answer 404.

Run: ``python bench/calibration_server.py --port 0 --ready-file F [--processes N]``. The ready
file receives the URL (one line) once the port is bound, as ``servelab sim`` does. It lives with
the benches (``bench/loadgen.py``) and the load generator's tests use it too.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import time

import orjson

from servelab.core.errors import ServelabError
from servelab.core.procs import write_ready_file
from servelab.sim.server.faults import HTTP_KINDS, FaultPlan, parse_faults

FAULT_HEADER = "x-servelab-faults"
_STATUS_TEXT = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests",
                500: b"Internal Server Error", 503: b"Service Unavailable"}
_WORD = b" tok"
# the simulator's answers to its HTTP faults: status, error type, message, Retry-After
_HTTP_FAULTS = {"http429": (429, "RateLimitError", "Too many requests: rate limit reached "
                            "(injected fault).", True),
                "http500": (500, "InternalServerError", "Internal server error (injected "
                            "fault).", False),
                "http503": (503, "ServiceUnavailableError", "Service unavailable (injected "
                            "fault).", True)}


class Settings:
    def __init__(self, ttft_s: float, itl_s: float, tokens_per_chunk: int,
                 reject_continuous: bool, metrics: bool, model: str, faults: str = "",
                 seed: int = 0):
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.tokens_per_chunk = max(1, tokens_per_chunk)
        self.reject_continuous = reject_continuous
        self.metrics = metrics
        self.model = model
        self.served = 0
        self.metrics_body: str | None = None
        self.chunks = 0
        self.rejected = 0
        self.record = False
        self.records: dict[str, list] = {}   # request id -> [arrival, chunk send times...]
        self.fault_plan = FaultPlan(parse_faults(faults), seed)

    def draw(self, header: str | None, rid: str):
        """(Fault, stall_s) of this request's fault, or None."""
        plan = FaultPlan(parse_faults(header), rid) if header else self.fault_plan
        fault = plan.draw()
        return None if fault is None else (fault, plan.spec.stall_s)


def fault_chunk(spec: str, request_id: str, output_tokens: int) -> int:
    """With one token per chunk: the index of the content chunk a request's own fault spec
    (``X-Servelab-Faults``) strikes on. A stall holds it back, a cut sends it and closes, an
    error event replaces it, a malformed frame comes just before it."""
    fault = FaultPlan(parse_faults(spec), request_id).draw()
    return max(1, fault.strike_token(output_tokens) - 1)


class _Stream:
    """One streamed response, driven by loop.call_at on an absolute schedule (no drift)."""

    __slots__ = ("proto", "head", "head_text", "n_out", "n_prompt", "continuous", "usage",
                 "sent", "t0", "fault", "fault_at", "pause", "shift", "kind", "tpc", "rid", "log")
    # fault: a stream fault of the simulator's grammar (stall, cut, malformed, error_event)

    def __init__(self, proto, kind, rid, n_out, n_prompt, continuous, usage, fault):
        s = proto.settings
        self.proto = proto
        self.kind = kind
        self.rid = rid
        self.n_out = n_out
        self.n_prompt = n_prompt
        self.continuous = continuous
        self.usage = usage
        self.tpc = s.tokens_per_chunk
        self.fault, self.fault_at, self.pause = None, 0, 0.0
        if fault is not None:
            self.fault, self.fault_at, self.pause = fault[0].kind, fault[0].strike_token(n_out), fault[1]
        self.sent = 0
        self.shift = 0.0
        obj = b"chat.completion.chunk" if kind == "chat" else b"text_completion"
        self.head = b'{"id":"%s","object":"%s","created":%d,"model":"%s","choices":' % (
            rid.encode(), obj, int(time.time()), s.model.encode())
        self.head_text = self.head + (b'[{"index":0,"delta":{"content":"' if kind == "chat"
                                      else b'[{"index":0,"text":"')

    def start(self, t0: float):
        self.t0 = t0
        s = self.proto.settings
        if s.record:
            self.log = s.records.setdefault(self.rid, [])
            self.log.append(time.time())
        p = self.proto
        p.write_chunk(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n", raw=True)
        if self.kind == "chat":
            p.write_chunk(b"data: " + self.head + b'[{"index":0,"delta":{"role":"assistant",'
                          b'"content":""},"logprobs":null,"finish_reason":null}]'
                          + self._usage_tail(0) + b"\n\n")
        p.loop.call_at(t0 + p.settings.ttft_s, self.next_chunk)

    def _usage_tail(self, completion: int) -> bytes:
        if self.continuous:
            return (b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}'
                    % (self.n_prompt, self.n_prompt + completion, completion))
        return b"}"

    def next_chunk(self):
        p = self.proto
        if p.transport is None or p.transport.is_closing():
            return
        index = self.sent // self.tpc
        k = min(self.tpc, self.n_out - self.sent)
        cut = False
        if self.fault is not None and self.sent > 0 and self.sent + k >= self.fault_at:
            kind = self.fault   # as the simulator: never on the first content chunk
            self.fault = None
            if kind == "stall":
                self.shift += self.pause
                p.loop.call_at(self._due(index), self.next_chunk)
                return
            if kind == "error_event":
                p.write_chunk(b'data: {"error":{"message":"Injected fault: the engine failed '
                              b'mid-stream","type":"InternalServerError","param":null,'
                              b'"code":500}}\n\ndata: [DONE]\n\n')
                p.finish_body()
                return
            if kind == "malformed":
                p.write_chunk(b"data: " + self.head_text + b"abc\n\n")
            cut = kind == "cut"
        self.sent += k
        last = self.sent >= self.n_out
        finish = b'"length"' if last else b"null"
        tail = (b'"},"logprobs":null,"finish_reason":%s}]' if self.kind == "chat"
                else b'","logprobs":null,"finish_reason":%s,"stop_reason":null}]') % finish
        p.write_chunk(b"data: " + self.head_text + _WORD * k + tail
                      + self._usage_tail(self.sent) + b"\n\n")
        if p.settings.record:
            self.log.append(time.time())
        p.settings.chunks += 1
        if cut:   # this chunk went out; the connection closes before usage and [DONE]
            p.transport.close()
            return
        if not last:
            p.loop.call_at(self._due(self.sent // self.tpc), self.next_chunk)
            return
        out = b""
        if self.usage:
            out += (b"data: " + self.head + b'[],"usage":{"prompt_tokens":%d,"total_tokens":%d,'
                    b'"completion_tokens":%d}}\n\n' % (self.n_prompt, self.n_prompt + self.sent,
                                                      self.sent))
        out += b"data: [DONE]\n\n"
        p.write_chunk(out)
        p.finish_body()

    def _due(self, index: int) -> float:
        s = self.proto.settings
        return self.t0 + s.ttft_s + index * s.itl_s + self.shift


class CalibrationProtocol(asyncio.Protocol):
    def __init__(self, settings: Settings, loop):
        self.settings = settings
        self.loop = loop
        self.transport = None
        self.buf = b""
        self.busy = False

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc):
        self.transport = None

    def data_received(self, data):
        self.buf += data
        self._try_request()

    def _try_request(self):
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {}
        for h in head[1:]:
            k, _, v = h.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", 0))
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4:end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        self.busy = True
        self.handle(method, path.split("?", 1)[0], headers, body)

    def write_chunk(self, data: bytes, raw: bool = False):
        if self.transport is None:
            return
        self.transport.write(data if raw else b"%x\r\n%s\r\n" % (len(data), data))

    def finish_body(self):
        if self.transport is None:
            return
        self.transport.write(b"0\r\n\r\n")
        self.busy = False
        if self.buf:
            self._try_request()

    def respond(self, status: int, body: bytes, ctype: bytes = b"application/json",
                extra: bytes = b""):
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%sContent-Length: %d\r\n\r\n%s"
                             % (status, _STATUS_TEXT.get(status, b"Error"), ctype, extra,
                                len(body), body))
        self.busy = False
        if self.buf:
            self._try_request()

    def error(self, status: int, message: str, err_type: str = "Error", retry: bool = False):
        self.respond(status, orjson.dumps({"error": {"message": message, "type": err_type,
                                                     "param": None, "code": status}}),
                     extra=b"Retry-After: 1\r\n" if retry else b"")

    def handle(self, method, path, headers, body):
        s = self.settings
        if method == "GET":
            return self._get(path)
        kind = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(path)
        if method != "POST" or kind is None:
            return self.error(404, f"no route {method} {path}")
        rid = headers.get("x-request-id") or f"calib-{s.served + 1}"
        try:
            fault = s.draw(headers.get(FAULT_HEADER), rid)
        except ServelabError as exc:
            return self.error(400, f"{FAULT_HEADER}: {exc}")
        if fault is not None and fault[0].kind in HTTP_KINDS:
            status, err_type, message, retry = _HTTP_FAULTS[fault[0].kind]
            return self.error(status, message, err_type, retry)
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return self.error(400, f"JSON decode error: {exc}")
        opts = req.get("stream_options") or {}
        if opts.get("continuous_usage_stats") and s.reject_continuous:
            s.rejected += 1
            return self.error(400, "[{'type': 'extra_forbidden', 'loc': ('body', "
                              "'stream_options', 'continuous_usage_stats')}]")
        n_out = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        prompt = req.get("prompt") if kind == "completions" else req.get("messages")
        n_prompt = max(1, len(orjson.dumps(prompt)) // 4)
        s.served += 1
        if not req.get("stream"):
            text = (_WORD * n_out).decode()
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if kind == "chat"
                      else {"index": 0, "text": text, "finish_reason": "length"})
            return self.respond(200, orjson.dumps({
                "id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
                "model": s.model, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}}))
        _Stream(self, kind, rid, n_out, n_prompt, bool(opts.get("continuous_usage_stats")),
                bool(opts.get("include_usage")), fault).start(self.loop.time())


    def _get(self, path):
        s = self.settings
        if path == "/health":
            return self.respond(200, b"")
        if path == "/calib/requests":
            # {request id: [arrival, send time of each content chunk]} (Unix s), then cleared
            records, s.records = s.records, {}
            return self.respond(200, orjson.dumps(records))
        if path == "/v1/models":
            return self.respond(200, orjson.dumps({"object": "list", "data": [
                {"id": s.model, "object": "model", "owned_by": "servelab"}]}))
        if path == "/metrics" and s.metrics_body is not None:
            # a page that is no Prometheus text (a gateway's JSON, a login page)
            return self.respond(200, s.metrics_body.encode(), b"application/json")
        if path == "/metrics" and s.metrics:
            text = ("# HELP calib_requests_total Requests served.\n"
                    "# TYPE calib_requests_total counter\n"
                    f'calib_requests_total{{model_name="{s.model}"}} {s.served}\n'
                    "# HELP calib_chunks_total Content chunks sent.\n"
                    "# TYPE calib_chunks_total counter\n"
                    f"calib_chunks_total {s.chunks}\n"
                    "# HELP calib_rejected_total Requests refused for continuous_usage_stats.\n"
                    "# TYPE calib_rejected_total counter\n"
                    f"calib_rejected_total {s.rejected}\n")
            return self.respond(200, text.encode(), b"text/plain; version=0.0.4")
        return self.error(404, f"no route {path}")


def _serve(sock: socket.socket, settings: Settings):
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a pinned dependency on Linux
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(
        loop.create_server(lambda: CalibrationProtocol(settings, loop), sock=sock))
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    loop.add_signal_handler(signal.SIGINT, loop.stop)
    try:
        loop.run_forever()
    finally:
        server.close()


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/calibration_server.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--processes", type=int, default=1, help="server processes on one port")
    ap.add_argument("--reject-continuous", action="store_true")
    ap.add_argument("--no-metrics", action="store_true")
    ap.add_argument("--metrics-body", help="answer GET /metrics 200 with this body instead "
                    "(e.g. '{}': a page the Prometheus parser refuses)")
    ap.add_argument("--record", action="store_true", help="keep every request's chunk send "
                    "times for GET /calib/requests (one process only)")
    ap.add_argument("--model", default="calibration")
    ap.add_argument("--faults", default="", help="the simulator's --faults SPEC, e.g. cut=0.1")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --faults draws")
    ap.add_argument("--ready-file")
    a = ap.parse_args(argv)
    sock = _listen(a.host, a.port)
    port = sock.getsockname()[1]
    url = f"http://{a.host}:{port}"
    settings = Settings(a.ttft_ms / 1000.0, a.itl_ms / 1000.0, a.tokens_per_chunk,
                        a.reject_continuous, not a.no_metrics, a.model, a.faults, a.seed)
    settings.record = a.record
    settings.metrics_body = a.metrics_body
    children = []
    for _ in range(max(1, a.processes) - 1):
        # each process its own socket on the same port (SO_REUSEPORT): the kernel hashes each
        # new connection to one listener, so no process wakes for another's accept
        child_sock = _listen(a.host, port)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _serve(child_sock, settings)
            os._exit(0)
        child_sock.close()
        children.append(pid)
    if a.ready_file:
        write_ready_file(a.ready_file, url)
    else:
        print(url, flush=True)
    try:
        _serve(sock, settings)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
