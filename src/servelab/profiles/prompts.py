"""Prompt text for planned requests, cut from the shipped corpus to the exact target length.

A first-turn prompt is laid out as ``[shared prefix][tag][body]``:
- shared prefix (classes with ``prefix_tokens``): one fixed text per (class, group) of exactly
  ``prefix_tokens`` plain tokens, starting with the run salt line and ending with a newline, so
  requests of a group share it within a run but not across runs;
- tag (salt on): ``Request <salt>: w1 w2 w3`` plus a newline, where the words spell the request
  index; unique per request, so no two prompts of a run share more than their group's prefix;
- body: text from a corpus slot chosen by (seed, index), cut to the remaining tokens.

The target ``prompt_tokens`` is the whole prompt as the server counts it: the chat template (or
BOS) overhead and the tag are taken out of the body. Lengths add up piece by piece (each piece is
counted once and cached; each piece ends in its own newline, which byte-level BPE does not merge
with the next piece's first letter, though Qwen's regex keeps punctuation and a newline together,
so the tag's words are measured without it), and every counter re-counts the first prompts whole
to confirm it (a server counter with one /tokenize each). Later turns of a session send
``history + [new user message]``; the new message's body has the turn's planned tokens less the
per-message template overhead, and the target is the counted conversation.
"""
from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from servelab.profiles.corpus import Corpus, load_corpus
from servelab.profiles.planner import PlannedRequest
from servelab.profiles.schema import Profile, Sampling

_MASK = (1 << 64) - 1
VERIFY_FIRST = 32
# Index digits of the tag, base 64: words that are one token in GPT-2, Llama and Qwen vocabularies.
TAG_WORDS = tuple((
    "the and of to in is was for on with as by at it he be from this that have not are but "
    "his they her she or an will my one all would there their what so up out if about who "
    "get which go me when make can like time no just him know take people into year your "
    "good some could"
).split())


def _mix(*values: int) -> int:
    """splitmix64 over the values: a cheap, stable hash for choosing text slots."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
        x ^= x >> 31
    return x


def tag_words(index: int) -> list[str]:
    digits = []
    while index or len(digits) < 3:
        index, d = divmod(index, 64)
        digits.append(TAG_WORDS[d])
    return digits[::-1]


@dataclass(frozen=True)
class BuiltPrompt:
    index: int
    class_name: str
    endpoint: str                 # chat | completions
    prompt: str | None            # completions: the prompt text
    messages: list[dict]          # the conversation sent (chat); for completions, its parts
    prompt_tokens: int            # target length of the whole prompt, as the server counts it
    counted_prompt_tokens: int    # the counter's count of what was built (== target if reachable)
    output_tokens: int            # target output length (max_tokens)
    prefix_tokens: int            # shared-prefix tokens at the start of the prompt
    prefix_group: int | None
    turn: int
    count_source: str             # server | tokenizer | estimate
    sampling: Sampling

    def payload(self, model: str, stream: bool = True) -> dict:
        """The OpenAI-compatible request body (vLLM extensions: ignore_eos)."""
        body: dict = {"model": model, "max_tokens": self.output_tokens,
                      "temperature": self.sampling.temperature, "top_p": self.sampling.top_p,
                      "ignore_eos": self.sampling.ignore_eos, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.endpoint == "chat":
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        return body

    def history_with(self, reply: str) -> list[dict]:
        """The history to pass when building this session's next turn."""
        return self.messages + [{"role": "assistant", "content": reply}]


class PromptBuilder:
    """Builds prompts for PlannedRequests; safe to share between threads and greenlets."""

    def __init__(self, profile: Profile, counter, salt: str | None = None,
                 seed: int | None = None):
        self.profile = profile
        self.counter = counter
        self.chat = profile.endpoint == "chat"
        self.seed = profile.seed if seed is None else int(seed)
        self.salt = (salt or secrets.token_hex(3)) if profile.salt else None
        self._classes = {c.name: (i, c, load_corpus(c.text)) for i, c in
                         enumerate(profile.classes)}
        self._bodies: OrderedDict = OrderedDict()
        self._prefixes: dict = {}
        self._lock = threading.Lock()
        self._learned = False
        # Server counters too re-count their first prompts whole (a round trip each): the piece
        # sum is an assumption about the server's tokenizer, checked before it is trusted.
        self._verify_left = (1 << 62) if counter.cheap else VERIFY_FIRST
        self._tag_whole = False
        self.mismatches = 0       # whole-prompt recounts that disagreed with the piece sum

    # ---- one-time calibration -------------------------------------------------------------
    def _learn(self) -> None:
        if self._learned:
            return
        c = self.counter
        sample, other = "Hello there, how are you today?", "Fine, thank you."
        if self.chat:
            one = [{"role": "user", "content": sample}]
            self.overhead = c.count_chat(one) - c.count_plain(sample)
            two = one + [{"role": "assistant", "content": other}]
            three = two + [{"role": "user", "content": sample}]
            self.turn_overhead = c.count_chat(three) - c.count_chat(two) - c.count_plain(sample)
        else:
            self.overhead = c.count(sample) - c.count_plain(sample)
            self.turn_overhead = c.count_plain("a\n\n" + sample) - c.count_plain("a") \
                - c.count_plain(sample)
        if self.salt is not None and not c.fast:
            self._learn_tag_words()
        self._learned = True

    def _learn_tag_words(self) -> None:
        """Token count of every tag word (server counters: one request when all are single).

        The words are measured against ``head`` without its newline: Qwen-style pre-tokenizers
        keep punctuation and the newline after it together (``:\\n`` is one token), so a base of
        ``head + "\\n"`` made every word look two tokens long and every prompt 2 tokens short.
        The sum is then checked against whole tags; where it does not hold, tags are counted
        whole (one cached request each)."""
        c, head = self.counter, f"Request {self.salt}:"
        base = c.count_plain(head)
        # A tag always ends "<word>\n"; a letter and the newline do not merge.
        self._tag_newline = c.count_plain(head + " the\n") - c.count_plain(head + " the")
        together = c.count_plain(head + "".join(" " + w for w in TAG_WORDS))
        if together - base == len(TAG_WORDS):
            self._word_tokens = dict.fromkeys(TAG_WORDS, 1)
        else:
            self._word_tokens = {w: c.count_plain(f"{head} {w}") - base for w in TAG_WORDS}
        self._tag_base = base + self._tag_newline
        self._tag_whole = any(
            self._tag_sum(i) != c.count_plain(self._tag_text(i)) for i in (0, 1, 4097, 262143))

    def _tag_text(self, index: int) -> str:
        return f"Request {self.salt}: " + " ".join(tag_words(index)) + "\n"

    def _tag_sum(self, index: int) -> int:
        return self._tag_base + sum(self._word_tokens[w] for w in tag_words(index))

    # ---- pieces ---------------------------------------------------------------------------
    def tag(self, index: int) -> tuple[str, int]:
        text = self._tag_text(index)
        if self.counter.fast or self._tag_whole:
            return text, self.counter.count_plain(text)
        return text, self._tag_sum(index)

    def body(self, corpus: Corpus, slot: int, n: int) -> tuple[str, int]:
        """Corpus text from a slot, ``n`` plain tokens long (cached per (corpus, slot, n))."""
        key = (corpus.name, slot, n)
        with self._lock:
            hit = self._bodies.get(key)
            if hit is not None:
                self._bodies.move_to_end(key)
                return hit
        value = self.counter.cut(corpus, corpus.slots[slot], n)
        with self._lock:
            self._bodies[key] = value
            if len(self._bodies) > 8192:
                self._bodies.popitem(last=False)
        return value

    def prefix(self, class_name: str, group: int) -> tuple[str, int]:
        """The shared prefix of a (class, group): exactly prefix_tokens plain tokens."""
        key = (class_name, group)
        hit = self._prefixes.get(key)
        if hit is not None:
            return hit
        ci, spec, corpus = self._classes[class_name]
        want = spec.prefix_tokens
        head = f"Shared context {self.salt}.\n" if self.salt else ""
        slot = _mix(self.seed, ci, group, 0x50524546) % len(corpus.slots)
        count = self.counter.count_plain
        n = max(1, want - count(head) - 1)
        for _ in range(4):
            text = head + self.counter.cut(corpus, corpus.slots[slot], n)[0] + "\n"
            got = count(text)
            if got == want or n == 1:
                break
            n = max(1, n + want - got)
        value = (text, got)
        self._prefixes[key] = value
        return value

    # ---- build ----------------------------------------------------------------------------
    def build(self, request: PlannedRequest, history: list[dict] | None = None) -> BuiltPrompt:
        """The prompt for a request; pass ``history`` (see BuiltPrompt.history_with) for turns
        after the first."""
        self._learn()
        _, spec, corpus = self._classes[request.class_name]
        slot = _mix(self.seed, request.index) % len(corpus.slots)
        if request.turn > 1 and history:
            return self._build_turn(request, history, spec, corpus, slot)
        parts, used = [], self.overhead
        if spec.prefix_tokens:
            text, n = self.prefix(spec.name, request.prefix_group or 0)
            parts.append(text)
            used += n
        if self.salt is not None:
            text, n = self.tag(request.index)
            parts.append(text)
            used += n
        target = request.prompt_tokens
        body_n = max(1, target - used)
        for _ in range(3):
            text, n = self.body(corpus, slot, body_n)
            content = "".join(parts) + text
            messages = [{"role": "user", "content": content}]
            counted = self._check(messages, content, used + n)
            if counted == target or body_n + target - counted < 1:
                break
            body_n += target - counted   # the joints did not add up: resize the body
        return BuiltPrompt(request.index, spec.name, self.profile.endpoint,
                           None if self.chat else content, messages, request.prompt_tokens,
                           counted, request.output_tokens, spec.prefix_tokens,
                           request.prefix_group, request.turn, self.counter.source,
                           spec.sampling)

    def _build_turn(self, request, history, spec, corpus, slot) -> BuiltPrompt:
        body_n = max(1, request.prompt_tokens - self.turn_overhead)
        text, _ = self.body(corpus, slot, body_n)
        messages = list(history) + [{"role": "user", "content": text}]
        if self.chat:
            prompt, counted = None, self.counter.count_chat(messages)
        else:
            prompt = "\n\n".join(m.get("content") or "" for m in messages)
            counted = self.counter.count(prompt)
        return BuiltPrompt(request.index, spec.name, self.profile.endpoint, prompt, messages,
                           counted, counted, request.output_tokens, 0, request.prefix_group,
                           request.turn, self.counter.source, spec.sampling)

    def _check(self, messages, content: str, counted: int) -> int:
        """Re-count the first prompts whole with a fast counter; trust the piece sum after."""
        if self._verify_left <= 0:
            return counted
        self._verify_left -= 1
        c = self.counter
        whole = c.count_chat(messages) if self.chat else c.count(content)
        if whole != counted:
            self.mismatches += 1
            self._verify_left = 1 << 30   # keep re-counting: pieces do not add up here
        return whole
