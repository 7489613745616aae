"""servelab's request path against a real SSE server: timings, tokens, and every error kind.

The calibration server streams with fixed delays and injects one deterministic fault per request
(X-Calib-Fault header); the client runs in a gevent subprocess exactly as inside Locust.
"""
import socket
import urllib.request

from loadgen_helpers import calibration, probe

TTFT_MS, ITL_MS = 20.0, 5.0


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_outcomes_and_error_kinds(tmp_path):
    with calibration(tmp_path, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)) as url, \
            calibration(tmp_path, "--ttft-ms", "5", "--itl-ms", "2", "--reject-continuous",
                        name="old") as old_url:
        fast = {"between_chunks_s": 0.25, "first_token_s": 0.4, "total_s": 5.0}
        cases = [
            {"name": "ok_chat", "url": url, "max_tokens": 8},
            {"name": "ok_completions", "url": url, "max_tokens": 6, "chat": False},
            {"name": "http500", "url": url, "fault": "http500"},
            {"name": "http429", "url": url, "fault": "http429"},
            {"name": "stall", "url": url, "fault": "stall:700@3", "timeouts": fast},
            {"name": "slow_first", "url": url, "fault": "stall:900@0", "timeouts": fast},
            {"name": "total", "url": url, "max_tokens": 400,
             "timeouts": {"total_s": 0.3}},
            {"name": "cut", "url": url, "fault": "cut@4"},
            {"name": "malformed", "url": url, "fault": "malformed@2"},
            {"name": "badsse", "url": url, "fault": "badsse@2"},
            {"name": "error_event", "url": url, "fault": "error@3"},
            {"name": "nodone", "url": url, "fault": "nodone"},
            {"name": "refused", "url": f"http://127.0.0.1:{_closed_port()}"},
            {"name": "old_server", "url": old_url, "max_tokens": 5, "repeat": 3},
        ]
        results = probe(cases)
        by = {}
        for r in results:
            by.setdefault(r["name"], []).append(r)

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
                                        "response_length": 8, "failed": False}]
        comp = by["ok_completions"][0]
        assert comp["error_kind"] is None and len(comp["chunk_offsets_ms"]) == 6

        err = by["http500"][0]
        assert err["error_kind"] == "http_500" and err["http_status"] == 500
        assert "injected http500" in err["error_text"]
        assert err["locust_events"][0]["failed"] is True
        assert by["http429"][0]["error_kind"] == "http_429"

        stall = by["stall"][0]
        assert stall["error_kind"] == "timeout_between_chunks"
        assert len(stall["chunk_offsets_ms"]) == 3
        assert by["slow_first"][0]["error_kind"] == "timeout_first_token"
        assert by["slow_first"][0]["chunk_offsets_ms"] == []
        assert by["total"][0]["error_kind"] == "timeout_total"

        cut = by["cut"][0]
        assert cut["error_kind"] == "stream_cut" and len(cut["chunk_offsets_ms"]) == 4
        mal = by["malformed"][0]
        assert mal["error_kind"] == "malformed_json"
        assert len(mal["chunk_offsets_ms"]) == 8  # the rest of the stream is still timed
        assert by["badsse"][0]["error_kind"] == "malformed_sse"
        ev = by["error_event"][0]
        assert ev["error_kind"] == "error_event" and "injected failure" in ev["error_text"]
        assert len(ev["chunk_offsets_ms"]) == 3
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
