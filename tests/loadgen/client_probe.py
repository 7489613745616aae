"""Runs servelab's request path (a FastHttpSession's pool, the stream reactor, the watchdog)
in a gevent process.

Used by test_client.py in a subprocess, so gevent's monkey-patching stays out of pytest:
``python client_probe.py CASES_JSON`` prints one JSON line per request with the outcome. A case
is ``{"url", "fault" (X-Calib-Fault header or null), "timeouts": {...}, "max_tokens", "chat",
"repeat", "fault_first" (the fault on the first request only), "parallel" (users streaming at
once, each with its own session), "headers" (the session's default headers)}``. The url "echo"
is a small server started here that records every request head it reads (printed last as
``{"heads": [...]}``) and sets a cookie in its first answer.
"""
from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
from gevent.server import StreamServer  # noqa: E402
from locust.contrib.fasthttp import FastHttpSession  # noqa: E402
from locust.event import EventHook  # noqa: E402

from servelab.loadgen.options import Timeouts  # noqa: E402
from servelab.loadgen.request import ALL_STATUSES, RequestSpec, Target, execute  # noqa: E402
from servelab.loadgen.stream import reactor  # noqa: E402
from servelab.loadgen.watchdog import Watchdog  # noqa: E402


class EchoServer:
    """Answers every POST with a two-chunk chat stream; keeps each request head it read."""

    def __init__(self):
        self.heads = []
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
            self.heads.append({"head": text, "body_length": len(body)})
            cookie = b"Set-Cookie: sid=abc; Path=/\r\n" if len(self.heads) == 1 else b""
            events = b"".join(
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
    for case in cases:
        if case["url"] == "echo":
            echo = echo or EchoServer()
            case["url"] = echo.url
        timeouts = Timeouts(**case.get("timeouts", {}))
        watchdog = Watchdog(timeouts, resolution_s=0.02)
        chat = case.get("chat", True)
        key = (case["url"], chat)
        target = targets.setdefault(key, Target(case["url"], chat, "calibration"))
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
            # the calibration server reads the fault from this header
            session.client.default_headers["X-Calib-Fault"] = case["fault"]
        else:
            session.client.default_headers.pop("X-Calib-Fault", None)
        rid = f"probe-{i}" if case.get("parallel", 1) == 1 else f"probe-{u}-{i}"
        out = execute(session, target, RequestSpec(rid, "probe", body), watchdog)
        print(json.dumps({
            "name": case.get("name"), "user": u, **out.as_columns(),
            "continuous_ok": target.continuous_ok,
            "locust_events": [{"name": e["name"], "response_time": e["response_time"],
                               "response_length": e["response_length"],
                               "failed": e["exception"] is not None, "url": e["url"]}
                              for e in mine],
        }), flush=True)
        mine.clear()


if __name__ == "__main__":
    main()
