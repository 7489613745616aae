"""Deterministic output text: the simulator "generates" by continuing a shipped English corpus.

A request's output is a walk through the tokenized corpus (the shipped text of ``profiles.corpus``)
that starts at a sentence chosen by hashing the prompt's token ids with the sampling seed. So the
same prompt and seed give the same text, different prompts give different text, and every chunk
decodes to readable words.

Precision effects ("divergence"): with a divergence rate ``d`` > 0, each output position has
probability ``d`` (drawn from a hash of prompt, seed and the variant's salt) of being where the
output departs from the BF16 baseline; from there the walk jumps to another sentence. With ``d`` =
0 every variant produces the baseline text exactly, which is what an output-fidelity comparison
needs as its control.

Natural stops: unless ``ignore_eos`` is set, the output ends with an end-of-text token after the
first sentence end past a natural length drawn (log-normal, median 180 tokens, ShareGPT's mean
output) from the same hash, and never before ``min_tokens``.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import math
import random
import struct
from array import array
from statistics import NormalDist

from servelab.core.paths import DATA_DIR
from servelab.profiles.corpus import shipped_texts
from servelab.sim.server.tokenizer import SimTokenizer, get_tokenizer

NATURAL_MEDIAN_TOKENS = 180
NATURAL_SIGMA = 0.8
_SENTENCE_END = (".", "!", "?")
_STD_NORMAL = NormalDist()
# Typography a byte-level tokenizer would split into several tokens per character; the corpus is
# folded to ASCII so that every token decodes to whole characters on its own.
_ASCII_FOLD = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "--",
     "\u2026": "...", "\u00a0": " "}
)


# The corpus's token ids, tokenized ahead (``write_corpus_ids``): tokenizing it took 0.3 s of CPU
# at every simulator start. The file begins with the digest of what the ids follow from (the
# tokenizer file and the folded paragraphs); on any other digest the corpus is tokenized afresh.
CORPUS_IDS_PATH = DATA_DIR / "corpus_ids.bin"
_DIGEST_BYTES = 32


def corpus_digest(tokenizer_bytes: bytes, paragraphs: list[str]) -> bytes:
    h = hashlib.blake2b(tokenizer_bytes, digest_size=_DIGEST_BYTES)
    for p in paragraphs:
        h.update(p.encode("ascii"))
        h.update(b"\0")
    return h.digest()


def corpus_paragraphs(texts: list[str]) -> list[str]:
    paragraphs = []
    for text in texts:
        text = text.translate(_ASCII_FOLD).encode("ascii", "ignore").decode("ascii")
        paragraphs += [p.strip() + "\n\n" for p in text.split("\n\n") if p.strip()]
    return paragraphs


def corpus_ids(tokenizer: SimTokenizer, paragraphs: list[str], path=CORPUS_IDS_PATH) -> array:
    """The paragraphs' ids: from ``path`` where it was written for exactly these inputs."""
    digest = corpus_digest(tokenizer.source_bytes, paragraphs)
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if data[:_DIGEST_BYTES] == digest:
        ids = array("H")
        ids.frombytes(data[_DIGEST_BYTES:])
        return array("i", ids)
    return _tokenize(tokenizer, paragraphs)


def _tokenize(tokenizer: SimTokenizer, paragraphs: list[str]) -> array:
    ids = array("i")
    for chunk in tokenizer.encode_batch(paragraphs):
        ids.extend(chunk)
    return ids


def write_corpus_ids(path=CORPUS_IDS_PATH) -> int:
    """Tokenize the shipped corpus and write its ids (after the shipped text or the tokenizer
    changes; tests/sim_server/test_sim_text_and_accounting.py says when)."""
    tokenizer = get_tokenizer()
    paragraphs = corpus_paragraphs(shipped_texts())
    ids = _tokenize(tokenizer, paragraphs)
    if tokenizer.vocab_size > 1 << 16:
        raise ValueError("corpus ids are stored as 16-bit numbers; this tokenizer has "
                         f"{tokenizer.vocab_size:,} tokens")
    path.write_bytes(corpus_digest(tokenizer.source_bytes, paragraphs) + array("H", ids).tobytes())
    return len(ids)


class TokenCorpus:
    """The shipped text as one sequence of token ids, with the positions where sentences end."""

    def __init__(self, tokenizer: SimTokenizer, texts: list[str], ids_path=CORPUS_IDS_PATH):
        ids = corpus_ids(tokenizer, corpus_paragraphs(texts), ids_path)
        if len(ids) < 1000:
            raise RuntimeError(f"the output corpus in {DATA_DIR} is missing or too small")
        self.ids = ids
        self.text_of = text_of = tokenizer.token_text
        # Positions of tokens that end a sentence; outputs start right after one of them.
        self.sentence_ends = array(
            "i", (i for i, t in enumerate(ids) if text_of[t].rstrip().endswith(_SENTENCE_END))
        )

    def __len__(self) -> int:
        return len(self.ids)

    def sentence_start(self, h: int) -> int:
        """A sentence's first word (past the whitespace after the previous sentence's end)."""
        ends, ids, text_of = self.sentence_ends, self.ids, self.text_of
        pos = (ends[h % len(ends)] + 1) % len(ids)
        for _ in range(8):
            if text_of[ids[pos]].strip():
                break
            pos = (pos + 1) % len(ids)
        return pos

    def next_sentence_end(self, pos: int) -> int:
        """Corpus position of the first sentence-ending token at or after ``pos`` (wrapping)."""
        k = bisect.bisect_left(self.sentence_ends, pos)
        if k == len(self.sentence_ends):
            return self.sentence_ends[0] + len(self.ids)
        return self.sentence_ends[k]


@functools.lru_cache(maxsize=1)
def get_corpus() -> TokenCorpus:
    return TokenCorpus(get_tokenizer(), shipped_texts())


def request_key(prompt_ids, sample_seed: int | None) -> bytes:
    """Digest of what determines the output: the prompt's tokens and the sampling seed."""
    h = hashlib.blake2b(array("i", prompt_ids).tobytes(), digest_size=16)
    h.update(b"greedy" if sample_seed is None else struct.pack("<q", sample_seed))
    return h.digest()


def _int(key: bytes, *salt) -> int:
    h = hashlib.blake2b(key, digest_size=8)
    for s in salt:
        h.update(str(s).encode())
    return int.from_bytes(h.digest(), "little")


class OutputText:
    """The output token ids of one request, produced on demand as the engine emits tokens."""

    __slots__ = ("corpus", "segments", "eos_pos", "eos_id")

    def __init__(self, corpus: TokenCorpus, key: bytes, max_tokens: int, *,
                 divergence: float = 0.0, salt: str = "", eos_id: int = 0):
        self.corpus = corpus
        n = len(corpus)
        # (first output position, corpus position) per segment; a divergence starts a segment.
        self.segments = [(0, corpus.sentence_start(_int(key, "start")))]
        if divergence > 0:
            rng = random.Random(_int(key, "divergence", salt))
            pos = 0
            log_keep = math.log1p(-min(divergence, 0.999999))
            while True:
                pos += 1 + int(math.log(1.0 - rng.random()) / log_keep)
                if pos >= max_tokens:
                    break
                jump = corpus.sentence_start(_int(key, "jump", salt, pos))
                if jump == (self.segments[-1][1] + pos - self.segments[-1][0]) % n:
                    jump = (jump + 1) % n
                self.segments.append((pos, jump))
        self.eos_pos = None
        self.eos_id = eos_id

    def natural_stop(self, key: bytes, min_tokens: int) -> int:
        """Set and return ``eos_after``: output tokens up to and including the end-of-text token."""
        u = (_int(key, "length") + 0.5) / 2.0**64
        z = _STD_NORMAL.inv_cdf(u)
        target = max(int(NATURAL_MEDIAN_TOKENS * math.exp(NATURAL_SIGMA * z)), min_tokens, 1)
        period = self._sentence_end_at_or_after(target - 1)
        self.eos_pos = max(period + 1, min_tokens)
        return self.eos_pos + 1

    def _sentence_end_at_or_after(self, out_pos: int) -> int:
        segs = self.segments
        k = bisect.bisect_right(segs, (out_pos, float("inf"))) - 1
        while True:
            seg_start, corpus_pos = segs[k]
            offset = max(out_pos - seg_start, 0)
            end = self.corpus.next_sentence_end(corpus_pos + offset)
            found = seg_start + (end - corpus_pos)
            if k + 1 == len(segs) or found < segs[k + 1][0]:
                return found
            k += 1

    def ids(self, start: int, stop: int):
        """Output token ids for output positions ``start`` .. ``stop - 1``."""
        corpus_ids = self.corpus.ids
        n = len(corpus_ids)
        segs = self.segments
        eos = self.eos_pos
        if len(segs) == 1 and (eos is None or stop <= eos):  # the streaming hot path
            a = (segs[0][1] + start) % n
            b = a + stop - start
            if b <= n:
                return corpus_ids[a:b]
        out: list[int] = []
        if eos is not None and stop > eos:
            tail = stop - eos if start <= eos else stop - start
            stop = max(min(stop, eos), start)
        else:
            tail = 0
        pos = start
        k = bisect.bisect_right(segs, (pos, float("inf"))) - 1 if len(segs) > 1 else 0
        while pos < stop:
            seg_start, corpus_pos = segs[k]
            seg_stop = segs[k + 1][0] if k + 1 < len(segs) else stop
            upto = min(stop, seg_stop)
            a = (corpus_pos + pos - seg_start) % n
            b = a + (upto - pos)
            if b <= n:
                out += corpus_ids[a:b]
            else:
                out += corpus_ids[a:] + corpus_ids[: b - n]
            pos = upto
            k += 1
        if tail:
            out += [self.eos_id] * tail
        return out

