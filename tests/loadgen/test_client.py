"""servelab's request path against a real SSE server: timings, tokens, and every error kind.

The calibration server streams with fixed delays and injects each request's own fault, given in
the simulator's fault grammar (X-Servelab-Faults header) and struck where the simulator would
(``fault_chunk``); the client runs in a gevent subprocess exactly as inside Locust.
"""
import json
import urllib.request

from loadgen_helpers import calibration, fault_chunk, probe
from servelab.core.procs import free_port

TTFT_MS, ITL_MS = 20.0, 5.0


def test_outcomes_and_error_kinds(tmp_path):
    with calibration(tmp_path, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)) as url, \
            calibration(tmp_path, "--ttft-ms", "5", "--itl-ms", "2", "--reject-continuous",
                        name="old") as old_url, \
            calibration(tmp_path, "--ttft-ms", "900", name="slow") as slow_url:
        fast = {"between_chunks_s": 0.25, "first_token_s": 0.4, "total_s": 5.0}
        cases = [
            {"name": "ok_chat", "url": url, "max_tokens": 8},
            {"name": "ok_completions", "url": url, "max_tokens": 6, "chat": False},
            {"name": "http500", "url": url, "fault": "http500=1"},
            {"name": "http429", "url": url, "fault": "http429=1"},
            {"name": "stall", "url": url, "fault": "stall=1:700ms", "timeouts": fast},
            {"name": "slow_first", "url": slow_url, "timeouts": fast},
            {"name": "total", "url": url, "max_tokens": 400,
             "timeouts": {"total_s": 0.3}},
            {"name": "cut", "url": url, "fault": "cut=1"},
            {"name": "malformed", "url": url, "fault": "malformed=1"},
            {"name": "badsse", "url": "badsse"},
            {"name": "error_event", "url": url, "fault": "error_event=1"},
            {"name": "nodone", "url": "nodone"},
            {"name": "refused", "url": f"http://127.0.0.1:{free_port()}"},
            {"name": "old_server", "url": old_url, "max_tokens": 5, "repeat": 3},
        ]
        # the content chunk a fault strikes on: drawn from the request id (probe-0, 8 tokens),
        # the same for every kind given alone at rate 1
        at = fault_chunk("cut=1", "probe-0", 8)
        results = probe(cases)
        by = {}
        for r in results:
            by.setdefault(r.get("name"), []).append(r)
        assert by[None] == [{"reactor_streams_left": 0}]

        ok = by["ok_chat"][0]
        assert ok["error_kind"] is None and ok["http_status"] == 200
        assert ok["finish_reason"] == "length" and ok["response_id"] == "probe-0"
        assert len(ok["chunk_offsets_ms"]) == 8 and ok["chunk_tokens"] == [1] * 8
        assert ok["chunk_token_source"] == "usage" and ok["token_source"] == "usage"
        assert ok["output_tokens"] == 8 and ok["prompt_tokens"] >= 1
        # TTFT counts from the first chunk with text, not the role-only chunk sent at once
        assert TTFT_MS <= ok["ttft_ms"] < TTFT_MS + 200
        gaps = [b - a for a, b in zip(ok["chunk_offsets_ms"], ok["chunk_offsets_ms"][1:])]
        # a busy machine may deliver two chunks in one read (a gap near 0), but the chunks span
        # the server's schedule: 7 gaps of ITL_MS
        assert abs(sum(gaps) / len(gaps) - ITL_MS) < 3 and max(gaps) < ITL_MS + 30, gaps
        assert abs(ok["e2e_ms"] - ok["chunk_offsets_ms"][-1]) < 0.001
        assert abs((ok["first_token_unix"] - ok["sent_unix"]) * 1000 - ok["ttft_ms"]) < 0.01
        # exactly one Locust entry: name = class, response_time = E2E, length = output tokens
        assert ok["locust_events"] == [{"name": "probe", "response_time": ok["e2e_ms"],
                                        "response_length": 8, "failed": False,
                                        "url": url + "/v1/chat/completions"}]
        comp = by["ok_completions"][0]
        assert comp["error_kind"] is None and len(comp["chunk_offsets_ms"]) == 6

        err = by["http500"][0]
        assert err["error_kind"] == "http_500" and err["http_status"] == 500
        assert "(injected fault)" in err["error_text"]
        assert err["locust_events"][0]["failed"] is True
        assert by["http429"][0]["error_kind"] == "http_429"

        stall = by["stall"][0]   # the chunks before the pause arrived, then the timeout
        assert stall["error_kind"] == "timeout_between_chunks"
        assert len(stall["chunk_offsets_ms"]) == at
        assert by["slow_first"][0]["error_kind"] == "timeout_first_token"
        assert by["slow_first"][0]["chunk_offsets_ms"] == []
        assert by["total"][0]["error_kind"] == "timeout_total"

        cut = by["cut"][0]   # the chunk it strikes on is the last one sent
        assert cut["error_kind"] == "stream_cut"
        assert len(cut["chunk_offsets_ms"]) == at + 1
        mal = by["malformed"][0]
        assert mal["error_kind"] == "malformed_json"
        assert len(mal["chunk_offsets_ms"]) == 8  # the rest of the stream is still timed
        assert by["badsse"][0]["error_kind"] == "malformed_sse"
        ev = by["error_event"][0]   # the error frame takes the place of that chunk
        assert ev["error_kind"] == "error_event" and "Injected fault" in ev["error_text"]
        assert len(ev["chunk_offsets_ms"]) == at
        assert by["nodone"][0]["error_kind"] == "stream_cut"
        ref = by["refused"][0]
        assert ref["error_kind"] == "connect_refused" and ref["http_status"] is None
        assert ref["locust_events"][0]["failed"] is True

        # An older server refuses continuous_usage_stats: one retry without it, remembered.
        old = by["old_server"]
        assert [r["error_kind"] for r in old] == [None, None, None]
        assert all(r["chunk_token_source"] == "estimated" for r in old)
        assert all(r["token_source"] == "usage" and r["output_tokens"] == 5 for r in old)
        assert old[0]["continuous_ok"] is False
        with urllib.request.urlopen(old_url + "/metrics") as resp:
            metrics = resp.read().decode()
        assert "calib_rejected_total 1\n" in metrics  # asked once, then remembered
        assert 'calib_requests_total{model_name="calibration"} 3\n' in metrics


def test_streams_read_together_and_after_failures(tmp_path):
    """Many streams at once go through the process's one epoll reactor; a stream it dropped for
    a timeout or a cut leaves nothing behind, and the same user's next request is clean."""
    with calibration(tmp_path, "--ttft-ms", "10", "--itl-ms", "3") as url:
        fast = {"between_chunks_s": 0.2, "first_token_s": 1.0, "total_s": 5.0}
        results = probe([
            {"name": "many", "url": url, "max_tokens": 20, "parallel": 48, "repeat": 2},
            {"name": "stall_then_ok", "url": url, "max_tokens": 6, "fault": "stall=1:600ms",
             "fault_first": True, "repeat": 2, "timeouts": fast},
            {"name": "cut_then_ok", "url": url, "max_tokens": 6, "fault": "cut=1",
             "fault_first": True, "repeat": 2},
            {"name": "malformed_then_ok", "url": url, "max_tokens": 6, "fault": "malformed=1",
             "fault_first": True, "repeat": 2},
        ])
    at = fault_chunk("cut=1", "probe-0", 6)   # every kind strikes there for this request id
    by = {}
    for r in results:
        by.setdefault(r.get("name"), []).append(r)
    many = by["many"]
    assert len(many) == 96 and len({r["response_id"] for r in many}) == 96
    for r in many:
        assert r["error_kind"] is None and r["finish_reason"] == "length"
        assert r["chunk_tokens"] == [1] * 20 and r["output_tokens"] == 20
        assert len(r["chunk_offsets_ms"]) == 20 and r["chunk_offsets_ms"] == \
            sorted(r["chunk_offsets_ms"])
        assert 9.0 <= r["ttft_ms"] < 500   # the server's timers (uvloop) are per millisecond
        assert len(r["locust_events"]) == 1 and r["locust_events"][0]["response_length"] == 20
    for name, kind, chunks in (("stall_then_ok", "timeout_between_chunks", at),
                               ("cut_then_ok", "stream_cut", at + 1),
                               ("malformed_then_ok", "malformed_json", 6)):
        first, second = by[name]
        assert first["error_kind"] == kind and len(first["chunk_offsets_ms"]) == chunks, first
        assert first["locust_events"][0]["failed"] is True
        assert second["error_kind"] is None and second["chunk_tokens"] == [1] * 6, second
        assert second["locust_events"][0]["failed"] is False
    assert by[None][0] == {"reactor_streams_left": 0}


def test_request_head_headers_and_cookies(tmp_path):
    """The request servelab writes itself: what FastHttpSession would send (the session's own
    default headers included), one id and length per request, and a cookie the server set."""
    results = probe([{"name": "echo", "url": "echo", "max_tokens": 2, "repeat": 2,
                      "headers": {"Authorization": "Bearer k-123"}}])
    first, second = [r for r in results if r.get("name") == "echo"]
    assert first["error_kind"] is None and first["chunk_tokens"] == [1, 1]
    assert first["token_source"] == "usage" and first["output_tokens"] == 2
    assert second["error_kind"] is None
    heads = [r for r in results if "heads" in r][0]["heads"]
    assert len(heads) == 2
    for i, h in enumerate(heads):
        lines = h["head"].split("\r\n")
        # the base URL ended with a slash: no "//" in the request target
        assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(": ")
            assert name.lower() not in fields, f"{name} sent twice"
            fields[name.lower()] = value
        assert fields["x-request-id"] == f"probe-{i}"
        assert int(fields["content-length"]) == h["body_length"] > 0
        assert fields["content-type"] == "application/json"
        assert fields["accept"] == "text/event-stream"
        assert fields["accept-encoding"] == "identity"
        assert fields["authorization"] == "Bearer k-123"
        assert fields["host"].startswith("127.0.0.1:")
        assert "user-agent" in fields
    assert "cookie" not in heads[0]["head"].lower()
    assert "\r\nCookie: sid=abc" in heads[1]["head"]


def test_a_sglang_target_gets_the_request_id_in_the_body_and_vllm_does_not(tmp_path):
    """SGLang names a request (and its spans' gen_ai.request.id) by the body's ``rid``; vLLM
    reads the X-Request-Id header and would log every unknown body field it ignores."""
    results = probe([{"name": "vllm", "url": "echo", "max_tokens": 2},
                     {"name": "sglang", "url": "echo", "max_tokens": 2, "id_field": "rid"}])
    heads = [r for r in results if "heads" in r][0]["heads"]
    bodies = [json.loads(h["body"]) for h in heads]
    assert "rid" not in bodies[0]
    assert bodies[1]["rid"] == "probe-0"
    assert all(b["stream"] is True for b in bodies)
    assert "x-request-id: probe-0" in heads[1]["head"].lower()


def test_which_targets_are_sent_the_id_in_the_body():
    """The kind decides (--server-kind, else the variant's); an unknown kind is refused with the
    flag and the kinds named."""
    import argparse

    import pytest

    from servelab.core.errors import ServelabError
    from servelab.loadgen.master.run_record import _request_id_field, _variant
    from servelab.loadgen.options import settings_from

    def field(**kw):
        settings = settings_from(argparse.Namespace(**kw))
        return _request_id_field(settings, _variant(settings.variant))

    assert field(server_kind="sglang") == "rid"
    assert field(variant="sglang_bf16") == "rid"
    assert field(variant="bf16") is None
    assert field(variant="a-label-only") is None
    assert field() is None
    assert field(server_kind="vllm", variant="sglang_bf16") is None
    with pytest.raises(ServelabError, match=r"--server-kind 'tgi'.*vllm, sglang"):
        field(server_kind="tgi")
