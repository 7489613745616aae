"""Runs servelab's request path (FastHttpSession + stream reader + watchdog) in a gevent process.

Used by test_client.py in a subprocess, so gevent's monkey-patching stays out of pytest:
``python client_probe.py CASES_JSON`` prints one JSON line per case with the outcome. A case is
``{"url", "fault" (X-Calib-Fault header or null), "timeouts": {...}, "max_tokens", "chat",
"repeat"}``.
"""
from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402

from locust.contrib.fasthttp import FastHttpSession  # noqa: E402
from locust.event import EventHook  # noqa: E402

from servelab.loadgen.options import Timeouts  # noqa: E402
from servelab.loadgen.request import ALL_STATUSES, RequestSpec, Target, execute  # noqa: E402
from servelab.loadgen.watchdog import Watchdog  # noqa: E402


def main() -> None:
    cases = json.loads(sys.argv[1])
    events = []
    hook = EventHook()
    hook.add_listener(lambda **kw: events.append(kw))
    targets = {}
    for case in cases:
        timeouts = Timeouts(**case.get("timeouts", {}))
        watchdog = Watchdog(timeouts, resolution_s=0.02)
        chat = case.get("chat", True)
        key = (case["url"], chat)
        target = targets.setdefault(key, Target(case["url"], chat, "calibration"))
        session = FastHttpSession(case["url"], request_event=hook, user=None, concurrency=4,
                                  network_timeout=None, connection_timeout=timeouts.connect_s)
        session.client.valid_response_codes = ALL_STATUSES
        headers = {"X-Calib-Fault": case["fault"]} if case.get("fault") else None
        for i in range(case.get("repeat", 1)):
            body = {"model": "calibration", "max_tokens": case.get("max_tokens", 8)}
            if chat:
                body["messages"] = [{"role": "user", "content": "hello"}]
            else:
                body["prompt"] = "hello"
            if headers:
                # the calibration server reads the fault from this header
                session.client.default_headers.update(headers)
            n_events = len(events)
            out = execute(session, target, RequestSpec(f"probe-{i}", "probe", body), watchdog)
            ev = events[n_events:]
            print(json.dumps({
                "name": case.get("name"), **out.as_columns(),
                "continuous_ok": target.continuous_ok,
                "locust_events": [{"name": e["name"], "response_time": e["response_time"],
                                   "response_length": e["response_length"],
                                   "failed": e["exception"] is not None} for e in ev],
            }), flush=True)
            if headers:
                for k in headers:
                    session.client.default_headers.pop(k, None)
        watchdog.stop()


if __name__ == "__main__":
    main()
