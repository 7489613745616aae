"""vLLM's SSE shapes, byte-level, over a raw socket; errors; /tokenize and /detokenize."""
import json

from sim_server_helpers import MODEL, get, post_json, sse

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
        "ignore_eos": True, "stream": True}


def test_chat_stream_shape(sim):
    res = sse(sim.url, "/v1/chat/completions",
              dict(CHAT, stream_options={"include_usage": True}))
    assert res.status == 200 and res.complete
    assert res.headers["content-type"].startswith("text/event-stream")
    assert res.data[-1] == "[DONE]"
    chunks = res.json_chunks()
    first, contents, usage = chunks[0], chunks[1:-1], chunks[-1]
    assert list(first) == ["id", "object", "created", "model", "choices"]
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert len(contents) == 6  # one chunk per engine step, one token per step without spec
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in contents)
    assert [c["choices"][0]["finish_reason"] for c in contents] == [None] * 5 + ["length"]
    assert len({c["id"] for c in chunks}) == 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 6


def test_completion_stream_shape_and_continuous_usage(sim):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    res = sse(sim.url, "/v1/completions", body)
    chunks = res.json_chunks()
    assert res.data[-1] == "[DONE]" and len(chunks) == 5
    c0 = chunks[0]
    assert list(c0) == ["id", "object", "created", "model", "choices", "usage"]
    assert c0["object"] == "text_completion" and c0["id"].startswith("cmpl-")
    assert list(c0["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "stop_reason"]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 4]
    assert chunks[-1]["choices"] == []


def test_completion_stream_without_usage_has_null_usage_and_no_usage_chunk(sim):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 3, "ignore_eos": True, "stream": True}
    chunks = sse(sim.url, "/v1/completions", body).json_chunks()
    assert len(chunks) == 3 and all(c["usage"] is None and c["choices"] for c in chunks)


def test_spec_decoding_puts_several_tokens_in_one_chunk(spec_sim):
    body = dict(CHAT, max_tokens=120, stream_options={"include_usage": True,
                                                      "continuous_usage_stats": True})
    chunks = sse(spec_sim.url, "/v1/chat/completions", body).json_chunks()
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]][1:]
    steps = [b - a for a, b in zip([0] + counts, counts)]
    assert sum(steps) == 120 and max(steps) > 1 and len(steps) < 120


def test_error_envelopes(sim):
    def err(path, body):
        status, payload = post_json(sim.url, path, body)
        assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param",
                                                                       "code"}
        assert payload["error"]["code"] == status
        return status, payload["error"]

    status, e = err("/v1/completions", {"model": MODEL, "prompt": list(range(10, 4106))})
    assert status == 400 and e["type"] == "BadRequestError"
    assert e["message"] == ("This model's maximum context length is 4096 tokens. However, your "
                            "request has 4096 input tokens. Please reduce the length of the input "
                            "messages.")
    status, e = err("/v1/completions", {"model": MODEL, "prompt": list(range(10, 1010)),
                                         "max_tokens": 3100})
    assert status == 400 and e["message"] == (
        "'max_tokens' or 'max_completion_tokens' is too large: 3100. This model's maximum context "
        "length is 4096 tokens and your request has 1000 input tokens (3100 > 4096 - 1000).")
    status, e = err("/v1/chat/completions", {"model": "gpt-4", "messages": []})
    assert status == 404 and e["type"] == "NotFoundError"
    assert e["message"] == "The model `gpt-4` does not exist."
    status, e = err("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"})
    assert status == 400 and "max_tokens" in e["message"]
    status, e = err("/v1/chat/completions", {"model": MODEL, "messages": "hi"})
    assert status == 400
    status, e = err("/v1/completions", {"model": MODEL, "prompt": "x",
                                         "stream_options": {"include_usage": True}})
    assert status == 400 and "stream=True" in e["message"]
    status, e = err("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2,
                                         "min_tokens": 3})
    assert status == 400 and "min_tokens" in e["message"]
    status, e = err("/v1/completions", {"model": MODEL, "prompt": ""})
    assert status == 400 and "empty" in e["message"]
    res = sse(sim.url, "/v1/completions", None, raw=b"{not json")
    assert res.status == 400 and json.loads(res.body)["error"]["code"] == 400


def test_omitted_max_tokens_is_the_rest_of_the_context(sim):
    status, body = post_json(sim.url, "/v1/completions",
                             {"model": MODEL, "prompt": list(range(10, 4086)), "ignore_eos": True})
    assert status == 200
    assert body["usage"]["completion_tokens"] == 4096 - 4076
    assert body["choices"][0]["finish_reason"] == "length"


def test_tokenize_detokenize_round_trip_and_chat_count(sim):
    text = "Speculative decoding puts several tokens in one chunk."
    status, tok = post_json(sim.url, "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 5
    assert tok["max_model_len"] == 4096
    status, detok = post_json(sim.url, "/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
    assert detok == {"prompt": text}
    messages = [{"role": "user", "content": text}]
    _, chat_tok = post_json(sim.url, "/tokenize", {"model": MODEL, "messages": messages})
    _, done = post_json(sim.url, "/v1/chat/completions",
                        {"model": MODEL, "messages": messages, "max_tokens": 1})
    assert chat_tok["count"] == done["usage"]["prompt_tokens"] > tok["count"]
    _, plain = post_json(sim.url, "/v1/completions",
                         {"model": MODEL, "prompt": text, "max_tokens": 1})
    assert plain["usage"]["prompt_tokens"] == tok["count"]


def test_health_version(sim):
    status, _, body = get(sim.url, "/health")
    assert status == 200 and body == b""
    status, _, body = get(sim.url, "/version")
    assert status == 200 and "version" in json.loads(body)


def test_long_prompts_count_the_same_off_the_event_loop(sim):
    text = "A long prompt is tokenized on a worker thread. " * 80  # > 1024 characters
    _, tok = post_json(sim.url, "/tokenize", {"prompt": text})
    _, done = post_json(sim.url, "/v1/completions", {"prompt": text, "max_tokens": 2})
    assert done["usage"]["prompt_tokens"] == tok["count"] > 400
