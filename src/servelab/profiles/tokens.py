"""Token counters: how many tokens the target server will see in a prompt.

``make_counter`` picks, in order:
1. ``server``: the target's vLLM ``POST /tokenize`` and ``/detokenize`` (exact for that model,
   chat template included); costs a round trip per new text, so results are cached.
2. ``tokenizer``: a local ``tokenizer.json`` (Hugging Face ``tokenizers``); chat prompts are
   counted with the ChatML template (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message,
   then ``<|im_start|>assistant\\n``), the template of Qwen2.5 and of servelab's simulator.
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
import math
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from pathlib import Path

from servelab.core import credentials

CHARS_PER_TOKEN = 4.0
CHAT_MESSAGE_TOKENS = 4     # <|im_start|> role \n ... <|im_end|> \n
CHAT_REPLY_TOKENS = 3       # <|im_start|> assistant \n
VERIFY_FIRST = 32           # cuts checked by a full count before trusting the fast path


class TokenCountError(RuntimeError):
    """The server's /tokenize or /detokenize failed or answered something unexpected."""


def render_chatml(messages: list[dict]) -> str:
    out = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
    return "".join(out) + "<|im_start|>assistant\n"


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
        self._verify_left = VERIFY_FIRST
        self._always_verify = False
        self._corpora: dict = {}
        self._lock = threading.Lock()

    def count_plain(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_chat(self, messages: list[dict]) -> int:
        return self.count_plain(render_chatml(messages))

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
    """Counts with the target's own tokenizer through vLLM's /tokenize and /detokenize."""

    source = "server"
    fast = False
    cheap = False

    def __init__(self, base_url: str, model: str, timeout: float = 30.0, headers=None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.headers = headers      # None: this process's credentials (core.credentials)
        self.note = ""
        self.max_model_len = None
        self._cache: OrderedDict = OrderedDict()
        self._window_ids: dict = {}
        self._lock = threading.Lock()

    def _post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        auth = credentials.headers() if self.headers is None else self.headers
        req = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                     headers={**auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode(errors="replace")
            raise TokenCountError(f"{self.base_url}{path}: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TokenCountError(f"{self.base_url}{path}: {exc}") from None

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

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        # vLLM's TokenizeCompletionRequest: add_special_tokens (BOS) defaults to True, as a
        # completions request does; sent explicitly so the count never rests on a default.
        body = {"model": self.model, "prompt": text, "add_special_tokens": special}
        reply = self._post("/tokenize", body)
        if not isinstance(reply.get("tokens"), list):
            raise TokenCountError(f"{self.base_url}/tokenize: no 'tokens' list in the reply")
        if reply.get("max_model_len"):
            self.max_model_len = reply["max_model_len"]
        return reply["tokens"]

    def detokenize(self, ids: list[int]) -> str:
        reply = self._post("/detokenize", {"model": self.model, "tokens": ids})
        if not isinstance(reply.get("prompt"), str):
            raise TokenCountError(f"{self.base_url}/detokenize: no 'prompt' text in the reply")
        return reply["prompt"]

    def count_plain(self, text: str) -> int:
        return self._cached(("plain", text), lambda: len(self.tokenize(text, special=False)))

    def count(self, text: str) -> int:
        return self._cached(("full", text), lambda: len(self.tokenize(text)))

    def count_chat(self, messages: list[dict]) -> int:
        key = ("chat", json.dumps(messages, sort_keys=True))

        def ask():
            # TokenizeChatRequest as a chat completion is counted: the template's generation
            # prompt on, no special tokens added beyond the template's own.
            reply = self._post("/tokenize", {"model": self.model, "messages": messages,
                                             "add_generation_prompt": True,
                                             "add_special_tokens": False})
            if not isinstance(reply.get("count"), int):
                raise TokenCountError(f"{self.base_url}/tokenize: no 'count' in the reply")
            return reply["count"]
        return self._cached(key, ask)

    def cut(self, corpus, start: int, n: int) -> tuple[str, int]:
        ids = self._ids_from(corpus, start, n)
        want = n
        for _ in range(4):
            text = self.detokenize(ids[:want])
            got = self.count_plain(text)
            if got == n:
                return text, n
            want = max(1, want + n - got)
            if want > len(ids):
                ids = self._ids_from(corpus, start, want)
        window = self.detokenize(ids[:n + 8])
        return fit_prefix(window, n, self.count_plain)

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
    """The first model id of GET /v1/models (what ``model: auto`` means)."""
    url = server_url.rstrip("/") + "/v1/models"
    auth = credentials.headers() if headers is None else headers
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth),
                                    timeout=timeout) as resp:
            data = json.loads(resp.read())
        return data["data"][0]["id"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise TokenCountError(f"{url}: cannot read the served model id ({exc})") from None


def make_counter(server_url: str | None = None, model: str | None = None,
                 tokenizer_json=None, timeout: float = 10.0, headers=None):
    """The best available counter: server, then local tokenizer.json, then the estimate.

    A server that cannot tokenize (unreachable, no /tokenize, an error) falls through to the next
    choice; the returned counter's ``note`` says why.
    """
    notes = []
    if server_url:
        try:
            name = (model if model and model != "auto"
                    else resolve_model(server_url, timeout, headers))
            counter = ServerCounter(server_url, name, timeout=timeout, headers=headers)
            counter.count_plain("Hello world.")
            return counter
        except TokenCountError as exc:
            notes.append(f"server counting unavailable: {exc}")
    if tokenizer_json:
        counter = TokenizerCounter(tokenizer_json)
        counter.note = "; ".join(notes)
        return counter
    counter = EstimateCounter()
    counter.note = "; ".join(notes + [f"estimate of {CHARS_PER_TOKEN:g} characters per token"])
    return counter
