"""A stand-in for ``python3 -m sglang.launch_server`` (the real one needs a GPU): it takes SGLang's
arguments, prints the WRITTEN start-up log of this folder and serves SGLang's routes that servelab
calls (GET /health, GET /metrics from metrics_bf16.txt, GET|POST /flush_cache) on --host/--port."""
from __future__ import annotations

import argparse
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).parent
METRICS_ON = False   # SGLang mounts /metrics only with --enable-metrics


def _written(name: str) -> str:
    return "".join(line for line in (HERE / name).read_text().splitlines(keepends=True)
                   if not line.startswith("#"))


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: str, kind: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/metrics" and METRICS_ON:
            self._send(200, _written("metrics_bf16.txt"), "text/plain; version=0.0.4")
        elif self.path.startswith("/flush_cache"):
            self.do_POST()
        else:
            self._send(404, '{"detail":"Not Found"}', "application/json")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.startswith("/flush_cache"):
            self._send(200, "Cache flushed.\nPlease check backend logs for more details. (When "
                            "there are running or waiting requests, the operation will not be "
                            "performed.)\n")
        else:
            self._send(404, '{"detail":"Not Found"}', "application/json")

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    global METRICS_ON
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--enable-metrics", action="store_true")
    args, _ = p.parse_known_args()   # the rest (--context-length ...) changes nothing here
    METRICS_ON = args.enable_metrics
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    sys.stdout.write(_written("startup_bf16.log"))
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
