"""Prompt text cut to exact token counts with the shipped tokenizer; prefixes, salt, sessions."""
from __future__ import annotations

import itertools

import pytest

from servelab.profiles import load_profile
from servelab.profiles.corpus import load_corpus, sections
from servelab.profiles.planner import RequestPlanner
from servelab.profiles.prompts import PromptBuilder
from servelab.profiles.tokens import EstimateCounter, make_counter
from servelab.core.paths import DATA_DIR

from .conftest import TOKENIZER_JSON

PROFILE = """
name: p
description: prompt test
endpoint: {endpoint}
seed: 9
salt: {salt}
classes:
  - name: rag
    text: kjv
    prefix_tokens: 300
    prefix_groups: 3
    prompt_tokens: {{kind: uniform, min: 1, max: 600}}
    output_tokens: 16
  - name: chat
    prompt_tokens: {{kind: lognormal, median: 200, sigma: 1.0, min: 1, max: 3000}}
    output_tokens: 16
  - name: code
    text: code
    prompt_tokens: {{kind: uniform, min: 100, max: 4000}}
    output_tokens: 16
load:
  concurrency: {{levels: [1], hold: 10}}
"""


def setup(write_profile, endpoint="chat", salt="true"):
    profile = load_profile(write_profile(PROFILE.format(endpoint=endpoint, salt=salt)))
    return profile, list(itertools.islice(RequestPlanner(profile).requests(), 400))


def whole_count(counter, built):
    return counter.count_chat(built.messages) if built.endpoint == "chat" else \
        counter.count(built.prompt)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_exact_lengths_with_the_local_tokenizer(write_profile, tokenizer_counter, endpoint):
    profile, reqs = setup(write_profile, endpoint)
    builder = PromptBuilder(profile, tokenizer_counter, salt="5eed01")
    exact = unreachable = 0
    for req in reqs:
        built = builder.build(req)
        actual = whole_count(tokenizer_counter, built)
        assert built.counted_prompt_tokens == actual, req
        assert built.prompt_tokens == req.prompt_tokens and built.output_tokens == 16
        if actual == req.prompt_tokens:
            exact += 1
        else:
            # Only targets below the fixed overhead (template, prefix, tag) are out of reach.
            assert actual > req.prompt_tokens and actual - req.prompt_tokens < 40, req
            unreachable += 1
    assert builder.mismatches == 0
    assert exact >= 390 and exact + unreachable == len(reqs)


def test_prefix_is_shared_within_a_group_and_nothing_more(write_profile, tokenizer_counter):
    profile, reqs = setup(write_profile)
    builder = PromptBuilder(profile, tokenizer_counter, salt="5eed02")
    rag = [(r, builder.build(r).messages[0]["content"]) for r in reqs if r.class_name == "rag"]
    prefixes = {g: builder.prefix("rag", g)[0] for g in range(3)}
    assert len(set(prefixes.values())) == 3
    for g, text in prefixes.items():
        assert tokenizer_counter.count_plain(text) == 300
        assert text.startswith("Shared context 5eed02.\n") and text.endswith("\n")
    for r, content in rag:
        assert content.startswith(prefixes[r.prefix_group])
        assert content[len(prefixes[r.prefix_group]):].startswith("Request 5eed02: ")
    # After the prefix every prompt is unique from its first line (the request's tag).
    tails = [c[len(prefixes[r.prefix_group]):].split("\n")[0] for r, c in rag]
    assert len(set(tails)) == len(rag)
    others = [builder.build(r).messages[0]["content"].split("\n")[0] for r in reqs
              if r.class_name != "rag"]
    assert len(set(others)) == len(others)


def test_salt_changes_prompts_unless_turned_off(write_profile, tokenizer_counter):
    profile, reqs = setup(write_profile)
    a = [PromptBuilder(profile, tokenizer_counter, salt="aaaaaa").build(r) for r in reqs[:30]]
    b = [PromptBuilder(profile, tokenizer_counter, salt="bbbbbb").build(r) for r in reqs[:30]]
    again = [PromptBuilder(profile, tokenizer_counter, salt="aaaaaa").build(r) for r in reqs[:30]]
    assert [x.messages for x in a] == [x.messages for x in again]       # deterministic
    assert all(x.messages[0]["content"][:40] != y.messages[0]["content"][:40]
               for x, y in zip(a, b))
    profile_off, reqs_off = setup(write_profile, salt="false")
    c = [PromptBuilder(profile_off, tokenizer_counter, salt="cccccc").build(r)
         for r in reqs_off[:100]]
    d = [PromptBuilder(profile_off, tokenizer_counter).build(r) for r in reqs_off[:100]]
    assert [x.messages for x in c] == [x.messages for x in d]
    assert not any(x.messages[0]["content"].startswith("Request ") for x in c)
    assert all(whole_count(tokenizer_counter, x) == x.prompt_tokens for x in c
               if x.prompt_tokens > 30)


def test_text_sources_are_real_prose_and_code():
    modern, code = load_corpus("modern"), load_corpus("code")
    raw = (DATA_DIR / "modern_prose.txt").read_text()
    kinds = {k for k, _, _ in sections(raw)}
    assert {"tech", "support", "story", "howto", "code", "notes"} <= kinds
    assert 60_000 <= len(raw.encode()) <= 100_000
    assert "### " not in modern.text and "def " in code.text and "SELECT" in code.text
    assert len(load_corpus("kjv").text) > 400_000
    assert all(modern.text[s - 1].isspace() and not modern.text[s].isspace()
               for s in modern.slots[1:])


def test_multi_turn_history_grows_by_the_planned_tokens(write_profile, tokenizer_counter):
    profile = load_profile(write_profile("""
        name: talk
        description: sessions
        seed: 4
        classes:
          - name: talk
            prefix_tokens: 64
            prompt_tokens: {kind: uniform, min: 20, max: 200}
            output_tokens: 30
            session: {turns: {kind: fixed, value: 4}, think_time: 2s}
        load:
          concurrency: {levels: [2], hold: 10}
        """))
    builder = PromptBuilder(profile, tokenizer_counter, salt="70a1c5")
    session = next(RequestPlanner(profile).sessions())
    assert [r.turn for r in session] == [1, 2, 3, 4]
    history = None
    for req in session:
        built = builder.build(req, history)
        assert built.turn == req.turn
        assert built.counted_prompt_tokens == tokenizer_counter.count_chat(built.messages)
        if history is None:
            assert built.counted_prompt_tokens == req.prompt_tokens
        else:
            assert built.messages[:-1] == history
            added = built.counted_prompt_tokens - tokenizer_counter.count_chat(history)
            assert added == req.prompt_tokens
        reply = f"Answer number {req.turn}: the weather stays fine all week."
        history = built.history_with(reply)
    assert len(history) == 8 and history[-1]["role"] == "assistant"


def test_completions_sessions_join_history_as_text(write_profile, tokenizer_counter):
    session_profile = load_profile(write_profile("""
        name: talkc
        description: completion sessions
        endpoint: completions
        classes:
          - name: t
            prompt_tokens: 50
            output_tokens: 10
            session: {turns: 2}
        load:
          concurrency: {levels: [1], hold: 5}
        """, "c.yaml"))
    builder = PromptBuilder(session_profile, tokenizer_counter, salt="abcdef")
    first, second = next(RequestPlanner(session_profile).sessions())
    b1 = builder.build(first)
    b2 = builder.build(second, b1.history_with(" and so it ends."))
    assert b2.prompt.startswith(b1.prompt + "\n\n and so it ends.\n\n")
    assert b2.counted_prompt_tokens == tokenizer_counter.count(b2.prompt)


def test_estimate_counter_is_exact_by_its_own_rule(write_profile):
    profile, reqs = setup(write_profile)
    counter = make_counter()           # no server, no tokenizer: the documented estimate
    assert isinstance(counter, EstimateCounter) and counter.source == "estimate"
    builder = PromptBuilder(profile, counter, salt="e5711a")
    for req in reqs[:200]:
        built = builder.build(req)
        assert built.count_source == "estimate"
        assert built.counted_prompt_tokens == counter.count_chat(built.messages)
        if req.prompt_tokens - req.prefix_tokens >= 100:
            assert built.counted_prompt_tokens == req.prompt_tokens


def test_payload_carries_sampling_and_targets(write_profile, tokenizer_counter):
    profile, reqs = setup(write_profile, "completions")
    built = PromptBuilder(profile, tokenizer_counter, salt="0").build(reqs[0])
    body = built.payload("m")
    assert body["prompt"] == built.prompt and "messages" not in body
    assert body["max_tokens"] == 16 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in built.payload("m", stream=False)


def test_tokenizer_counter_from_make_counter():
    counter = make_counter(tokenizer_json=TOKENIZER_JSON)
    assert counter.source == "tokenizer" and counter.count_plain("Hello world") == 2


def test_fit_prefix_finds_the_longest_prefix_within_the_budget(tokenizer_counter):
    from servelab.profiles.tokens import fit_prefix

    text = load_corpus("modern").window(0, 2000)
    for n in (1, 7, 50, 333):
        prefix, count = fit_prefix(text, n, tokenizer_counter.count_plain)
        assert count == tokenizer_counter.count_plain(prefix) <= n
        assert tokenizer_counter.count_plain(text[:len(prefix) + 1]) > n
