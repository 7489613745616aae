"""The shipped English text: prompts are cut from it, and the simulator's outputs continue it.

- ``kjv``: King James Version excerpts (``data/kjv_excerpts.txt``, public domain).
- ``modern``: servelab's own modern prose (``data/modern_prose.txt``): technical explanations,
  support dialogues, stories, how-to guides, meeting notes and commented code.
- ``code``: only the code sections of ``modern_prose.txt``.

``modern_prose.txt`` is divided into sections by header lines ``### KIND: Title``; the header
becomes a plain title line in the corpus. Prompts start at *slots*: word starts about every
``SLOT_CHARS`` characters, the same for every tokenizer, so a (slot, length) pair names one text.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from servelab.core.paths import DATA_DIR

SLOT_CHARS = 1500
SHIPPED_FILES = ("kjv_excerpts.txt", "modern_prose.txt")
SOURCES = {"kjv": "kjv_excerpts.txt", "modern": "modern_prose.txt", "code": "modern_prose.txt"}
_HEADER = re.compile(r"^### (\w+): (.+)$", re.MULTILINE)
_WORD_START = re.compile(r"(?<=\s)\S")


@dataclass(frozen=True)
class Corpus:
    name: str
    text: str
    slots: tuple[int, ...]   # character offsets where a prompt may start (word starts)

    def window(self, start: int, chars: int) -> str:
        """``chars`` characters from ``start`` on, wrapping round to the beginning as needed."""
        out = self.text[start:start + chars]
        while len(out) < chars:
            out += ("\n\n" + self.text)[:chars - len(out)]
        return out


def sections(text: str) -> list[tuple[str, str, str]]:
    """(kind, title, body) of each ``### KIND: Title`` section of modern_prose.txt."""
    heads = list(_HEADER.finditer(text))
    out = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out.append((head.group(1).lower(), head.group(2).strip(), text[head.end():end].strip()))
    return out


@functools.lru_cache(maxsize=None)
def load_corpus(name: str) -> Corpus:
    if name not in SOURCES:
        raise ValueError(f"unknown text source {name!r} (known: {', '.join(SOURCES)})")
    raw = _read(SOURCES[name])
    if name == "kjv":
        text = raw.strip()
    else:
        parts = [(k, t, b) for k, t, b in sections(raw) if name == "modern" or k == "code"]
        if not parts:
            raise ValueError(f"{SOURCES[name]} has no sections for the {name!r} text source")
        text = "\n\n".join(f"{title}\n\n{body}" for _, title, body in parts)
    return Corpus(name, text, word_slots(text, SLOT_CHARS))


def shipped_texts() -> list[str]:
    """Each shipped file's text as it is, headers included (the simulator's output corpus)."""
    return [_read(name) for name in SHIPPED_FILES if (DATA_DIR / name).exists()]


def _read(name: str) -> str:
    return (DATA_DIR / name).read_text(encoding="utf-8")


def word_slots(text: str, every: int) -> tuple[int, ...]:
    """The first word start at or after each multiple of ``every`` (and 0)."""
    slots = [0]
    pos = every
    while pos < len(text):
        match = _WORD_START.search(text, pos)
        if match is None:
            break
        if match.start() > slots[-1]:
            slots.append(match.start())
        pos = match.start() + every
    return tuple(slots)

