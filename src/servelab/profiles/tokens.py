"""Token counters: how many tokens the target server will see in a prompt.

``make_counter`` picks, in order:
1. ``server``: the target's vLLM ``POST /tokenize`` and ``/detokenize`` (exact for that model,
   chat template included); costs a round trip per new text, so results are cached.
2. ``tokenizer``: a local ``tokenizer.json`` (Hugging Face ``tokenizers``); chat prompts are
   counted with the ChatML template (``core.chatml``), the template of Qwen2.5 and of servelab's
   simulator.
3. ``estimate``: ``ceil(characters / CHARS_PER_TOKEN)`` with CHARS_PER_TOKEN = 4.0, plus
   CHAT_MESSAGE_TOKENS per chat message and CHAT_REPLY_TOKENS for the assistant prefix.

Every counter has ``count(text)`` (a completions prompt as the server counts it, special tokens
such as BOS included), ``count_plain(text)`` (no special tokens), ``count_chat(messages)`` and
``cut(corpus, start, n) -> (text, tokens)``: text from a corpus slot that is ``n`` plain tokens
(``tokens`` says otherwise in the rare case no cut of exactly ``n`` exists).
"""
from __future__ import annotations

import bisect
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from pathlib import Path

from servelab.core import bounded_http, credentials
from servelab.core.chatml import render_chat

CHARS_PER_TOKEN = 4.0
CHAT_MESSAGE_TOKENS = 4     # <|im_start|> role \n ... <|im_end|> \n
CHAT_REPLY_TOKENS = 3       # <|im_start|> assistant \n
VERIFY_FIRST = 32           # cuts checked by a full count before trusting the fast path
log = logging.getLogger("servelab.profiles")


class TokenCountError(RuntimeError):
    """The server's /tokenize, /detokenize or /v1/models failed or answered something
    unexpected: ``endpoint`` and ``outcome`` (a name of ``core.bounded_http.OUTCOMES``) say
    which and what, ``detail`` what came back."""

    def __init__(self, message: str, endpoint: str = "", outcome: str = "",
                 detail: str = ""):
        super().__init__(message)
        self.endpoint, self.outcome, self.detail = endpoint, outcome, detail


def _failed(url: str, endpoint: str, outcome: str, detail: str) -> TokenCountError:
    return TokenCountError(f"{url}: {bounded_http.describe(outcome)} ({outcome}): {detail}",
                           endpoint, outcome, detail)


def read_json(base_url: str, path: str, body: dict | None, headers: dict,
              timeout: float):
    """GET (``body`` None) or POST ``path`` of a server and its JSON reply, bounded in time and
    size; anything else raises a TokenCountError naming what came back."""
    data = None if body is None else json.dumps(body).encode()
    sent = dict(headers, **({"Content-Type": "application/json"} if data is not None else {}),
                Accept="application/json")
    try:
        answer = bounded_http.fetch(base_url, path, method="GET" if data is None else "POST",
                                    body=data, headers=sent, deadline_s=timeout)
    except ValueError as exc:   # not a URL servelab can ask
        raise TokenCountError(f"{base_url}{path}: {exc}", path, "unreachable") from None
    obj, outcome, detail = bounded_http.json_of(answer)
    if outcome != "ok":
        raise _failed(answer.url, path, outcome, detail)
    return obj


def _shape(url: str, path: str, obj, key: str, kind) -> object:
    """``obj[key]`` when obj is a JSON object holding a ``kind`` there, else wrong_shape."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        got = f"a JSON {type(obj).__name__}" + (f" with keys {sorted(obj)[:8]}"
                                                 if isinstance(obj, dict) else "")
        raise _failed(url + path, path, "wrong_shape",
                      f"{got}; no {kind.__name__} '{key}' in it")
    return value


def fit_prefix(text: str, n: int, count) -> tuple[str, int]:
    """The longest prefix of ``text`` with at most ``n`` tokens (binary search on characters).

    Used when a fast cut misses by a token or two; ``count`` must be non-decreasing in length.
    """
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= n:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo], count(text[:lo])


class EstimateCounter:
    source = "estimate"
    fast = True
    cheap = True      # counting a whole prompt costs nothing: the builder always re-counts

    def __init__(self, chars_per_token: float = CHARS_PER_TOKEN):
        self.chars_per_token = chars_per_token
        self.note = ""
        self.problem: TokenCountError | None = None   # why a server counter was not used

    def count_plain(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    count = count_plain

    def count_chat(self, messages: list[dict]) -> int:
        return sum(self.count_plain(m.get("content") or "") + CHAT_MESSAGE_TOKENS
                   for m in messages) + CHAT_REPLY_TOKENS

    def cut(self, corpus, start: int, n: int) -> tuple[str, int]:
        chars = int(n * self.chars_per_token)
        return corpus.window(start, chars), n


class TokenizerCounter:
    source = "tokenizer"
    fast = True
    cheap = False

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.path = Path(path)
        self._tok = Tokenizer.from_file(str(self.path))
        self.note = ""
        self.problem: TokenCountError | None = None   # why a server counter was not used
        self._verify_left = VERIFY_FIRST
        self._always_verify = False
        self._corpora: dict = {}
        self._lock = threading.Lock()

    def count_plain(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_chat(self, messages: list[dict]) -> int:
        return self.count_plain(render_chat(messages))

    def _encoded(self, corpus, start: int, n: int) -> tuple[str, list[int], list[int]]:
        """The corpus, wrapped round as far as needed, with every token's character span.

        Encoded once per corpus and extended (re-encoded longer) when a cut runs past its end;
        cuts across the wrap then see the same tokens the whole text would give.
        """
        with self._lock:
            entry = self._corpora.get(corpus.name)
        if entry is not None:
            text, starts, ends = entry
            t0 = bisect.bisect_right(starts, start) - 1
            if t0 + n <= len(starts):
                return entry
        extra = max(4096, int(n * 8))
        if entry is not None:
            extra = max(extra, 2 * (len(entry[0]) - len(corpus.text)))
        text = corpus.window(0, len(corpus.text) + extra)
        enc = self._tok.encode(text, add_special_tokens=False)
        entry = (text, [s for s, _ in enc.offsets], [e for _, e in enc.offsets])
        with self._lock:
            self._corpora[corpus.name] = entry
        return entry

    def cut(self, corpus, start: int, n: int) -> tuple[str, int]:
        text, starts, ends = self._encoded(corpus, start, n)
        t0 = max(0, bisect.bisect_right(starts, start) - 1)
        piece = text[starts[t0]:ends[t0 + n - 1]]
        with self._lock:
            verify = self._always_verify or self._verify_left > 0
            self._verify_left -= 1
        if verify and self.count_plain(piece) != n:
            # The BPE prefix property failed for this tokenizer: check every cut from now on.
            self._always_verify = True
            longer = text[starts[t0]:ends[min(t0 + n + 4, len(ends)) - 1]]
            return fit_prefix(longer, n, self.count_plain)
        return piece, n


class ServerCounter:
    """Counts with the target's own tokenizer through vLLM's /tokenize and /detokenize.

    ``fallback`` (a function making another counter, or None): what counts once the server
    stops answering usably. The switch is for the rest of the run (no flipping back and forth
    between two counts of the same text), logged once and kept in ``events``; each prompt built
    after it says which counter counted it (``count_source``). Without one, a failure raises."""

    fast = False
    cheap = False

    def __init__(self, base_url: str, model: str, timeout: float = 30.0, headers=None,
                 fallback=None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.headers = headers      # None: this process's credentials (core.credentials)
        self.note = ""
        self.source = "server"
        self.max_model_len = None
        self.fallback = fallback
        self.failed: TokenCountError | None = None
        self.events: list[dict] = []   # {t_unix, endpoint, outcome, detail} of the switch
        self._cache: OrderedDict = OrderedDict()
        self._window_ids: dict = {}
        self._lock = threading.Lock()

    def _post(self, path: str, body: dict) -> dict:
        auth = credentials.headers() if self.headers is None else self.headers
        return read_json(self.base_url, path, body, auth, self.timeout)

    def _cached(self, key, compute):
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        value = compute()
        with self._lock:
            self._cache[key] = value
            if len(self._cache) > 4096:
                self._cache.popitem(last=False)
        return value

    def _or_fallback(self, name: str, *args):
        if self.failed is None:
            try:
                return getattr(self, "_server_" + name)(*args)
            except TokenCountError as exc:
                if self.fallback is None:
                    raise
                self._switch(exc)
        return getattr(self.fallback, name)(*args)

    def _switch(self, exc: TokenCountError) -> None:
        fb = self.fallback = self.fallback()
        self.failed = exc
        self.source, self.fast, self.cheap = fb.source, fb.fast, fb.cheap
        self.note = f"server counting stopped: {exc}; counting with the {fb.source} counter"
        self.events.append(endpoint_event(exc))
        log.warning("servelab: %s; the prompts from now on are counted with the %s counter "
                    "(each row's prompt count source says so)", exc, fb.source)

    def count_plain(self, text: str) -> int:
        return self._or_fallback("count_plain", text)

    def count(self, text: str) -> int:
        return self._or_fallback("count", text)

    def count_chat(self, messages: list[dict]) -> int:
        return self._or_fallback("count_chat", messages)

    def cut(self, corpus, start: int, n: int) -> tuple[str, int]:
        return self._or_fallback("cut", corpus, start, n)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        # vLLM's TokenizeCompletionRequest: add_special_tokens (BOS) defaults to True, as a
        # completions request does; sent explicitly so the count never rests on a default.
        body = {"model": self.model, "prompt": text, "add_special_tokens": special}
        reply = self._post("/tokenize", body)
        tokens = _shape(self.base_url, "/tokenize", reply, "tokens", list)
        if reply.get("max_model_len"):
            self.max_model_len = reply["max_model_len"]
        return tokens

    def detokenize(self, ids: list[int]) -> str:
        reply = self._post("/detokenize", {"model": self.model, "tokens": ids})
        return _shape(self.base_url, "/detokenize", reply, "prompt", str)

    def _server_count_plain(self, text: str) -> int:
        return self._cached(("plain", text), lambda: len(self.tokenize(text, special=False)))

    def _server_count(self, text: str) -> int:
        return self._cached(("full", text), lambda: len(self.tokenize(text)))

    def _server_count_chat(self, messages: list[dict]) -> int:
        key = ("chat", json.dumps(messages, sort_keys=True))

        def ask():
            # TokenizeChatRequest as a chat completion is counted: the template's generation
            # prompt on, no special tokens added beyond the template's own.
            reply = self._post("/tokenize", {"model": self.model, "messages": messages,
                                             "add_generation_prompt": True,
                                             "add_special_tokens": False})
            return _shape(self.base_url, "/tokenize", reply, "count", int)
        return self._cached(key, ask)

    def _server_cut(self, corpus, start: int, n: int) -> tuple[str, int]:
        ids = self._ids_from(corpus, start, n)
        want = n
        for _ in range(4):
            text = self.detokenize(ids[:want])
            got = self._server_count_plain(text)
            if got == n:
                return text, n
            want = max(1, want + n - got)
            if want > len(ids):
                ids = self._ids_from(corpus, start, want)
        window = self.detokenize(ids[:n + 8])
        return fit_prefix(window, n, self._server_count_plain)

    def _ids_from(self, corpus, start: int, n: int) -> list[int]:
        """Server token ids of the corpus from ``start`` (cached per slot, grown as needed)."""
        key = (corpus.name, start)
        ids = self._window_ids.get(key)
        chars = int(n * 5) + 64
        while ids is None or len(ids) < n + 8:
            ids = self.tokenize(corpus.window(start, chars), special=False)
            chars *= 2
        self._window_ids[key] = ids
        return ids


def resolve_model(server_url: str, timeout: float = 10.0, headers=None) -> str:
    """The first model id of GET /v1/models (what ``model: auto`` means); a TokenCountError
    naming what came back when there is none."""
    auth = credentials.headers() if headers is None else headers
    url = server_url.rstrip("/")
    obj = read_json(url, "/v1/models", None, auth, timeout)
    models = _shape(url, "/v1/models", obj, "data", list)
    if not models:
        raise _failed(url + "/v1/models", "/v1/models", "no_model", "its 'data' list is empty")
    first = models[0]
    if not isinstance(first, dict) or not isinstance(first.get("id"), str) or not first["id"]:
        raise _failed(url + "/v1/models", "/v1/models", "wrong_shape",
                      f"its first model has no string 'id': {str(first)[:120]}")
    return first["id"]


def _next_choice(tokenizer_json):
    if tokenizer_json:
        return TokenizerCounter(tokenizer_json)
    counter = EstimateCounter()
    counter.note = f"estimate of {CHARS_PER_TOKEN:g} characters per token"
    return counter


def endpoint_event(exc: TokenCountError) -> dict:
    """An answer the counter could not use, as the worker ships it for ``endpoint_events``."""
    return {"t_unix": time.time(), "endpoint": exc.endpoint or "/tokenize",
            "outcome": exc.outcome or "error", "detail": str(exc)[:300]}


def make_counter(server_url: str | None = None, model: str | None = None,
                 tokenizer_json=None, timeout: float = 10.0, headers=None):
    """The best available counter: server, then local tokenizer.json, then the estimate.

    A server that cannot tokenize (unreachable, no /tokenize, an error, an answer of the wrong
    shape) falls through to the next choice, logged; the returned counter's ``note`` says why
    and with what it counts instead. A server counter that stops answering later in the run
    switches to that same next choice (``ServerCounter.fallback``).
    """
    if server_url:
        try:
            name = (model if model and model != "auto"
                    else resolve_model(server_url, timeout, headers))
            counter = ServerCounter(server_url, name, timeout=timeout, headers=headers)
            counter.count_plain("Hello world.")   # no fallback yet: this probe must raise
            counter.fallback = lambda: _next_choice(tokenizer_json)
            return counter
        except TokenCountError as exc:
            counter = _next_choice(tokenizer_json)
            counter.problem = exc
            # the worker ships ``events`` at its end: a /tokenize refused at start is an
            # endpoint_events row like one that fails mid-run, not only a log line
            counter.events = [endpoint_event(exc)]
            counter.note = "; ".join([f"server counting unavailable: {exc}"]
                                     + ([counter.note] if counter.note else []))
            log.warning("servelab: token counts: %s; counting prompt tokens with the %s "
                        "counter instead", exc, counter.source)
            return counter
    return _next_choice(tokenizer_json)
