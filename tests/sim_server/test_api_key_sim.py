"""The simulator enforces --api-key as vLLM's AuthenticationMiddleware does: 401 with
{"error":"Unauthorized"} on /v1, /v2, /inference and /cohere without the Bearer key; health,
metrics, version and the tokenizer routes stay open; OPTIONS passes."""
import json
import sys
import urllib.error
import urllib.request

import pytest

from servelab.sim.server.auth import configured_keys
from servelab.sim.server.server import start_background
from sim_server_helpers import FAST, MODEL

KEY = "sk-sim-test-0123456789"


@pytest.fixture(scope="module")
def keyed():
    fast = dict(FAST, serve_args=FAST["serve_args"] + ["--api-key", KEY])
    with start_background(seed=1, **fast) as bg:
        yield bg


def _call(url, path, method="GET", auth=None, body=None):
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.mark.parametrize("auth", [None, "", f"Bearer {KEY}x", f"Basic {KEY}", KEY,
                                  f"Bearer  {KEY}", f"Bearer {KEY[:-1]}"])
def test_guarded_routes_answer_401_with_vllms_body(keyed, auth):
    for path, method, body in (("/v1/models", "GET", None),
                               ("/v1/chat/completions", "POST", CHAT),
                               ("/v1/completions", "POST", dict(CHAT, prompt="hi"))):
        status, ctype, raw = _call(keyed.url, path, method, auth, body)
        assert status == 401, (path, auth)
        assert raw == b'{"error":"Unauthorized"}' and ctype.startswith("application/json")


def test_the_key_opens_them_any_scheme_case(keyed):
    for scheme in ("Bearer", "bearer", "BEARER"):
        status, _, raw = _call(keyed.url, "/v1/models", auth=f"{scheme} {KEY}")
        assert status == 200 and json.loads(raw)["data"][0]["id"] == MODEL
    status, _, raw = _call(keyed.url, "/v1/chat/completions", "POST", f"Bearer {KEY}", CHAT)
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] >= 1


def test_unguarded_routes_stay_open(keyed):
    for path in ("/health", "/ping", "/version", "/metrics"):
        assert _call(keyed.url, path)[0] == 200, path
    status, _, raw = _call(keyed.url, "/tokenize", "POST", body={"model": MODEL, "prompt": "hi"})
    assert status == 200 and json.loads(raw)["count"] >= 1
    # any other prefix under the guarded ones is guarded too (vLLM's startswith)
    assert _call(keyed.url, "/v2/anything")[0] == 401
    assert _call(keyed.url, "/inference/x", "POST", body={})[0] == 401


def test_401s_are_counted_like_any_answer(keyed):
    _call(keyed.url, "/v1/models")
    _, _, raw = _call(keyed.url, "/metrics")
    assert 'handler="/v1/models",method="GET",status="4xx"' in raw.decode()


def test_no_key_no_check(sim):
    assert _call(sim.url, "/v1/models")[0] == 200


def test_key_sources():
    env = {"VLLM_API_KEY": "from-env"}
    assert configured_keys(["a", ""], (), env) == ["a"]
    assert configured_keys((), ["--api-key=b", "--trust-remote-code"], env) == ["b"]
    assert configured_keys((), (), env) == ["from-env"]
    assert configured_keys((), (), {"VLLM_API_KEY": ""}) == []


def test_cli_flag_takes_several_keys_and_never_logs_them(tmp_path):
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "servelab.commands.sim", "--port", "0", "--hardware", "H100",
           "--model", MODEL, "--max-model-len", "4096", "--ready-file", str(ready),
           "--log-stats-interval", "0", "--api-key", "k-one-123", "k-two-456"]
    from servelab.core.procs import spawn

    child = spawn("sim", cmd, tmp_path / "sim.log", ready_file=ready)
    try:
        url = child.wait_ready(60)
        for key in ("k-one-123", "k-two-456"):
            assert _call(url, "/v1/models", auth=f"Bearer {key}")[0] == 200
        assert _call(url, "/v1/models")[0] == 401
    finally:
        child.stop(10)
    log = (tmp_path / "sim.log").read_text()
    assert "API key authentication" in log
    assert "k-one-123" not in log and "k-two-456" not in log
