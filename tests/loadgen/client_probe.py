"""Runs servelab's request path (a FastHttpSession's pool, the stream reactor, the watchdog)
in a gevent process.

Used by test_client.py in a subprocess, so gevent's monkey-patching stays out of pytest:
``python client_probe.py CASES_JSON`` prints one JSON line per request with the outcome. A case
is ``{"url", "fault" (a fault spec in the simulator's grammar, sent as the calibration server's
X-Servelab-Faults header, or null), "timeouts": {...}, "max_tokens", "chat", "repeat",
"fault_first" (the fault on the first request only), "parallel" (users streaming at once, each
with its own session), "headers" (the session's default headers)}``. The url "echo" is a small
server started here that records every request head it reads (printed last as
``{"heads": [...]}``) and sets a cookie in its first answer; "badsse" and "nodone" are servers
whose 200 stream breaks the protocol (a line that is not SSE; no ``[DONE]`` before the body
ends), which no real server's fault models.
"""
from gevent import monkey

monkey.patch_all()

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
from gevent.server import StreamServer  # noqa: E402
from locust.contrib.fasthttp import FastHttpSession  # noqa: E402
from locust.event import EventHook  # noqa: E402

from servelab.loadgen.client.request import (ALL_STATUSES, RequestSpec, Target,  # noqa: E402
                                             execute)
from servelab.loadgen.client.stream import reactor  # noqa: E402
from servelab.loadgen.client.watchdog import Watchdog  # noqa: E402
from servelab.loadgen.options import Timeouts  # noqa: E402
from servelab.loadgen.users import report_request  # noqa: E402

FAULT_HEADER = "X-Servelab-Faults"
_CHUNK = (b'{"id":"raw","choices":[{"index":0,"delta":{"content":"a"},'
          b'"finish_reason":null}]}')
# bodies of the protocol-breaking servers: two good chunks, then the break
RAW_BODIES = {
    "badsse": b"data: %s\n\ndata: %s\n\nthis is not server-sent events\n\ndata: [DONE]\n\n"
              % (_CHUNK, _CHUNK),
    "nodone": b"data: %s\n\ndata: %s\n\n" % (_CHUNK, _CHUNK),
}


class EchoServer:
    """Answers every POST with a two-chunk chat stream; keeps each request head it read."""

    def __init__(self, body: bytes | None = None):
        self.heads = []
        self.body = body     # a fixed stream body instead of the echo's own
        self.server = StreamServer(("127.0.0.1", 0), self.handle)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/"   # a trailing slash, too

    def handle(self, sock, _addr):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            text = head.decode("latin-1")
            length = int([h.split(":", 1)[1] for h in text.split("\r\n")
                          if h.lower().startswith("content-length:")][0])
            while len(buf) < length:
                buf += sock.recv(65536)
            body, buf = buf[:length], buf[length:]
            self.heads.append({"head": text, "body_length": len(body),
                               "body": body.decode("utf-8")})
            cookie = b"Set-Cookie: sid=abc; Path=/\r\n" if len(self.heads) == 1 else b""
            events = self.body or b"".join(
                b"data: %s\n\n" % e for e in (
                    b'{"id":"echo","choices":[{"index":0,"delta":{"role":"assistant",'
                    b'"content":""},"finish_reason":null}]}',
                    b'{"id":"echo","choices":[{"index":0,"delta":{"content":"a"},'
                    b'"finish_reason":null}]}',
                    b'{"id":"echo","choices":[{"index":0,"delta":{"content":"b"},'
                    b'"finish_reason":"stop"}]}',
                    b'{"id":"echo","choices":[],"usage":{"prompt_tokens":3,'
                    b'"completion_tokens":2,"total_tokens":5}}', b"[DONE]"))
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + cookie
                         + b"Content-Length: %d\r\n\r\n" % len(events) + events)


def main() -> None:
    cases = json.loads(sys.argv[1])
    events = {}   # greenlet -> the Locust request events it fired
    hook = EventHook()
    hook.add_listener(lambda **kw: events.setdefault(gevent.getcurrent(), []).append(kw))
    targets = {}
    echo = None
    raw = {}
    for case in cases:
        if case["url"] == "echo":
            echo = echo or EchoServer()
            case["url"] = echo.url
        elif case["url"] in RAW_BODIES:
            name = case["url"]
            raw[name] = raw.get(name) or EchoServer(RAW_BODIES[name])
            case["url"] = raw[name].url
        timeouts = Timeouts(**case.get("timeouts", {}))
        watchdog = Watchdog(timeouts, resolution_s=0.02)
        chat = case.get("chat", True)
        key = (case["url"], chat, case.get("id_field"))
        target = targets.setdefault(key, Target(case["url"], chat, "calibration",
                                                case.get("id_field")))
        users = [gevent.spawn(_user, case, u, target, watchdog, timeouts, hook, events)
                 for u in range(case.get("parallel", 1))]
        gevent.joinall(users, raise_error=True)
        watchdog.stop()
    print(json.dumps({"reactor_streams_left": reactor().streams()}), flush=True)
    if echo is not None:
        print(json.dumps({"heads": echo.heads}), flush=True)


def _user(case, u, target, watchdog, timeouts, hook, events):
    session = FastHttpSession(case["url"], request_event=hook, user=None, concurrency=1,
                              network_timeout=None, connection_timeout=timeouts.connect_s)
    session.client.valid_response_codes = ALL_STATUSES
    session.client.default_headers.update(case.get("headers") or {})
    mine = events.setdefault(gevent.getcurrent(), [])
    for i in range(case.get("repeat", 1)):
        body = {"model": "calibration", "max_tokens": case.get("max_tokens", 8)}
        if target.chat:
            body["messages"] = [{"role": "user", "content": "hello"}]
        else:
            body["prompt"] = "hello"
        if case.get("fault") and (i == 0 or not case.get("fault_first")):
            # the calibration server reads the request's own fault spec from this header
            session.client.default_headers[FAULT_HEADER] = case["fault"]
        else:
            session.client.default_headers.pop(FAULT_HEADER, None)
        rid = f"probe-{i}" if case.get("parallel", 1) == 1 else f"probe-{u}-{i}"
        out = execute(session, target, RequestSpec(rid, "probe", body), watchdog,
                      report=report_request)
        print(json.dumps({
            "name": case.get("name"), "user": u, **dataclasses.asdict(out.row),
            "continuous_ok": target.continuous_ok,
            "locust_events": [{"name": e["name"], "response_time": e["response_time"],
                               "response_length": e["response_length"],
                               "failed": e["exception"] is not None, "url": e["url"]}
                              for e in mine],
        }), flush=True)
        mine.clear()


if __name__ == "__main__":
    main()
