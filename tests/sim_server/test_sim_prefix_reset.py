"""POST /reset_prefix_cache, vLLM's development endpoint (served with VLLM_SERVER_DEV_MODE=1)."""
import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servelab.core.errors import ServelabError
from servelab.sim.server.server import server_dev_mode, start_background
from sim_server_helpers import FAST, MODEL, get, post_json, sse, sse_post

PROMPT = ("The prefix cache keeps the key and value blocks of a prompt it has seen, so a prompt "
          "sent again skips most of its prefill. ") * 6


@pytest.fixture(scope="module")
def dev_sim():
    lines = []
    with start_background(seed=5, dev_mode=True, log=lines.append, **FAST) as bg:
        bg.lines = lines
        yield bg


def prefix_counters(url):
    status, _, body = get(url, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out["vllm:prefix_cache_queries_total"], out["vllm:prefix_cache_hits_total"]


def hit_rate_of_one_request(url):
    q0, h0 = prefix_counters(url)
    status, body = post_json(url, "/v1/completions", {"model": MODEL, "prompt": PROMPT,
                                                      "max_tokens": 4, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 4
    q1, h1 = prefix_counters(url)
    assert q1 > q0
    return (h1 - h0) / (q1 - q0)


def test_reset_drops_the_hit_rate_of_a_repeated_prompt_to_zero(dev_sim):
    hit_rate_of_one_request(dev_sim.url)
    assert hit_rate_of_one_request(dev_sim.url) > 0.8  # the repeat hits all but its last block
    res = sse(dev_sim.url, "/reset_prefix_cache", None, raw=b"")
    assert res.status == 200 and res.body == b""  # vLLM: 200 and an empty body
    assert dev_sim.lines[-2:] == ["Resetting prefix cache...", "Successfully reset prefix cache"]
    assert hit_rate_of_one_request(dev_sim.url) == 0.0
    assert hit_rate_of_one_request(dev_sim.url) > 0.8  # cached again from then on


def test_a_reset_while_requests_run_fails_unless_they_are_preempted(dev_sim):
    async def scenario():
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        stream = asyncio.ensure_future(sse_post(dev_sim.url, "/v1/completions", body))
        await asyncio.sleep(0.15)  # ~1.5 ms steps: mid-stream
        refused = await sse_post(dev_sim.url, "/reset_prefix_cache", None, raw=b"")
        lines_refused = list(dev_sim.lines[-2:])
        forced = await sse_post(dev_sim.url, "/reset_prefix_cache?reset_running_requests=true",
                                None, raw=b"")
        lines_forced = list(dev_sim.lines[-2:])
        return await stream, refused, lines_refused, forced, lines_forced

    streamed, refused, lines_refused, forced, lines_forced = asyncio.run(scenario())
    assert refused.status == 200  # vLLM does not check the result in the API server either
    assert lines_refused[0] == "Resetting prefix cache..."
    assert lines_refused[1].startswith("WARNING Failed to reset prefix cache because some blocks (")
    assert lines_refused[1].endswith(") are not freed yet")
    assert forced.status == 200 and lines_forced[1] == "Successfully reset prefix cache"
    # The preempted request recomputes and still streams all of its tokens.
    chunks = streamed.json_chunks()
    assert sum(len(c["choices"][0]["text"]) > 0 for c in chunks) > 50
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and streamed.data[-1] == "[DONE]"


def test_the_endpoint_needs_dev_mode_as_in_vllm(sim):
    assert sse(sim.url, "/reset_prefix_cache", None, raw=b"").status == 404
    assert server_dev_mode({"VLLM_SERVER_DEV_MODE": "1"}) is True
    assert server_dev_mode({}) is False and server_dev_mode({"VLLM_SERVER_DEV_MODE": "0"}) is False
    with pytest.raises(ServelabError, match="VLLM_SERVER_DEV_MODE: found 'yes'"):
        server_dev_mode({"VLLM_SERVER_DEV_MODE": "yes"})


def test_a_bad_flag_value_is_a_400(dev_sim):
    res = sse(dev_sim.url, "/reset_prefix_cache?reset_running_requests=maybe", None, raw=b"")
    assert res.status == 400 and b"reset_running_requests" in res.body
