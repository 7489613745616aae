"""Counting with the target server: a real aiohttp server with vLLM's /tokenize and /detokenize.

The server tokenizes with the shipped tokenizer and, like Llama-style models, adds a BOS token
unless ``add_special_tokens`` is false, so the builder must learn and subtract that overhead.
Chat requests are counted through the ChatML template, as vLLM does with a model's template.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter

import pytest
from aiohttp import web
from tokenizers import Tokenizer

from servelab.profiles import load_profile
from servelab.profiles.planner import RequestPlanner
from servelab.profiles.prompts import PromptBuilder
from servelab.profiles.tokens import ServerCounter, TokenizerCounter, make_counter

from .conftest import EXACT_PROFILE, TOKENIZER_JSON

BOS = "<|endoftext|>"


class TokenizeServer:
    def __init__(self):
        self.tok = Tokenizer.from_file(str(TOKENIZER_JSON))
        self.bos = self.tok.token_to_id(BOS)
        self.calls: Counter = Counter()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def ids(self, body: dict) -> list[int]:
        if "messages" in body:
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                           for m in body["messages"]) + "<|im_start|>assistant\n"
            return self.tok.encode(text, add_special_tokens=False).ids
        ids = self.tok.encode(body["prompt"], add_special_tokens=False).ids
        return ([self.bos] + ids) if body.get("add_special_tokens", True) else ids

    async def tokenize(self, request):
        self.calls["tokenize"] += 1
        body = await request.json()
        if body.get("model") != "tiny-test-model":
            return web.json_response({"error": {"message": "unknown model", "code": 404}},
                                     status=404)
        ids = self.ids(body)
        return web.json_response({"count": len(ids), "max_model_len": 32768, "tokens": ids})

    async def detokenize(self, request):
        self.calls["detokenize"] += 1
        body = await request.json()
        return web.json_response({"prompt": self.tok.decode(body["tokens"],
                                                            skip_special_tokens=True)})

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": "tiny-test-model", "object": "model", "max_model_len": 32768}]})

    def start(self) -> str:
        app = web.Application()
        app.add_routes([web.post("/tokenize", self.tokenize),
                        web.post("/detokenize", self.detokenize),
                        web.get("/v1/models", self.models)])
        self.runner = web.AppRunner(app)
        self.thread.start()

        async def up():
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]
        port = asyncio.run_coroutine_threadsafe(up(), self.loop).result(10)
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server():
    srv = TokenizeServer()
    url = srv.start()
    yield srv, url
    srv.stop()




@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_prompts_are_exact_by_the_servers_count(server, write_profile, endpoint):
    srv, url = server
    counter = make_counter(url, "auto")       # auto: the first id of GET /v1/models
    assert isinstance(counter, ServerCounter) and counter.model == "tiny-test-model"
    profile = load_profile(write_profile(EXACT_PROFILE.format(endpoint=endpoint, hold="5s")))
    reqs = list(itertools.islice(RequestPlanner(profile).requests(), 40))
    builder = PromptBuilder(profile, counter, salt="5e4e4e")
    built = [builder.build(r) for r in reqs]
    for b, r in zip(built, reqs):
        # Count independently of the counter, as the server would for the real request.
        ids = srv.ids({"messages": b.messages} if endpoint == "chat" else {"prompt": b.prompt})
        assert len(ids) == r.prompt_tokens == b.counted_prompt_tokens, r
        assert b.count_source == "server"
    # Rebuilding the same requests is served from the caches: no round trips on the hot path.
    before = sum(srv.calls.values())
    again = [builder.build(r) for r in reqs]
    assert sum(srv.calls.values()) == before
    assert [b.messages for b in again] == [b.messages for b in built]


def test_server_counts_match_the_local_tokenizer_plus_bos(server):
    srv, url = server
    counter = ServerCounter(url, "tiny-test-model")
    local = TokenizerCounter(TOKENIZER_JSON)
    text = "In the beginning was the word, and the word was a token."
    assert counter.count(text) == local.count_plain(text) + 1
    assert counter.count_plain(text) == local.count_plain(text)
    messages = [{"role": "user", "content": text}]
    assert counter.count_chat(messages) == local.count_chat(messages)
    assert counter.max_model_len == 32768


def test_falls_back_when_the_server_cannot_count(server):
    _, url = server
    dead = make_counter("http://127.0.0.1:9", "m", tokenizer_json=TOKENIZER_JSON, timeout=2)
    assert dead.source == "tokenizer" and "server counting unavailable" in dead.note
    wrong_model = make_counter(url, "no-such-model")
    assert wrong_model.source == "estimate"
    assert "HTTP 404" in wrong_model.note and "4 characters per token" in wrong_model.note
