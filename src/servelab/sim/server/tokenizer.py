"""The simulator's tokenizer: servelab's own byte-level BPE (``data/tokenizer.json``).

It stands in for the served model's tokenizer. Counts are close to, not equal to, Qwen's or
Llama's; what matters is that ``/tokenize``, ``usage`` and the engine all count with the same one.

Chat prompts are rendered with the ChatML template (``core.chatml``), so a chat request is
counted as the model would see it.
"""
from __future__ import annotations

import functools
from pathlib import Path

import orjson
from tokenizers import Tokenizer

from servelab.core.chatml import IM_END, IM_START
from servelab.core.paths import DATA_DIR

TOKENIZER_PATH = DATA_DIR / "tokenizer.json"
ENDOFTEXT = "<|endoftext|>"


class SimTokenizer:
    def __init__(self, path=TOKENIZER_PATH):
        self.source_bytes = Path(path).read_bytes()   # what the corpus's shipped ids follow from
        self._tok = Tokenizer.from_buffer(self.source_bytes)
        self.vocab_size = self._tok.get_vocab_size()
        self.endoftext_id = self._tok.token_to_id(ENDOFTEXT)
        self.im_end_id = self._tok.token_to_id(IM_END)
        self.special_ids = frozenset(
            self._tok.token_to_id(t) for t in (ENDOFTEXT, IM_START, IM_END)
        )
        # Per-id text and its JSON-escaped form: the streaming hot path joins these instead of
        # decoding and escaping every chunk. Special tokens read as "" (vLLM skips them).
        texts = [self._tok.decode([i]) for i in range(self.vocab_size)]
        for i in self.special_ids:
            texts[i] = ""
        self.token_text = texts
        self.token_json = [orjson.dumps(t)[1:-1] for t in texts]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def token_strs(self, ids) -> list[str]:
        return [self._tok.id_to_token(i) for i in ids]


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> SimTokenizer:
    return SimTokenizer()
