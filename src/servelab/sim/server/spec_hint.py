"""Speculative acceptance from the prompt's content: the server's per-request ``spec_acceptance``.

Drafts are accepted when the target would have produced them. That is likely on text with
structure, and unlikely on random token soup (``vllm bench serve --dataset-name random``): a small
draft model cannot predict what the target makes of noise, and prompt lookup (n-gram) finds no
continuation worth proposing. Prompt lookup also gains on text that repeats itself (code edits,
summaries quoting their source), because its drafts are copied from the context. Two statistics of
the prompt's last ``WINDOW`` tokens measure this; docs/simulator.md gives the formulas::

    u = 1 - distinct / (V (1 - (1 - 1/V)^n))    token reuse: ~0 for random ids, 0.25+ for prose
    s = clamp((u - 0.05) / 0.20)                structure, 0 (token soup) .. 1 (prose, code)
    r = share of 3-grams seen earlier in the prompt
    a = a_eq (0.3 + 0.7 s)                                  draft model, EAGLE
    a = a_eq (0.3 + 0.7 s) + (0.95 - a_eq) clamp((r - 0.2) / 0.8)   n-gram
    capped at 0.95; prompts shorter than MIN_TOKENS get no hint (the engine's defaults)

``a_eq`` is the constant acceptance with the same expected accepted tokens per draft as the
method's per-position defaults, so ordinary prose is accepted as the defaults say.
"""
from __future__ import annotations

from collections.abc import Sequence

WINDOW = 2048          # tokens at the prompt's end that are examined
MIN_TOKENS = 128       # below this, reuse does not tell prose from noise reliably
REUSE_NOISE = 0.05     # retokenized random text reuses up to ~5% of its tokens
REUSE_PROSE = 0.25     # English prose of 128+ tokens reuses 25-75% (more the longer)
SOUP_SHARE = 0.3       # share of the default acceptance left on token soup
REPEAT_FROM = 0.2      # n-gram: repetition above which prompt lookup does better than default
MAX_ACCEPTANCE = 0.95


def ngram_repetition(ids: Sequence[int], n: int = 3) -> float:
    """Share of the prompt's n-grams that already occurred earlier in it (0 = none)."""
    count = len(ids) - n + 1
    if count <= 1:
        return 0.0
    return (count - len(set(zip(*(ids[i:] for i in range(n)))))) / count


def token_reuse(ids: Sequence[int], vocab_size: int) -> float:
    """1 - distinct tokens / the distinct count expected of as many uniform random ids."""
    n = len(ids)
    if n == 0:
        return 0.0
    expected = vocab_size * (1.0 - (1.0 - 1.0 / vocab_size) ** n)
    return max(0.0, 1.0 - len(set(ids)) / expected)


def expected_accepted(rates: Sequence[float]) -> float:
    """Expected accepted tokens of one draft: position i is reached only if all before it were
    accepted (Leviathan et al.)."""
    total, reach = 0.0, 1.0
    for p in rates:
        reach *= p
        total += reach
    return total


def equivalent_acceptance(rates: Sequence[float]) -> float:
    """The constant per-position acceptance with the same expected accepted tokens as ``rates``."""
    target, k = expected_accepted(rates), len(rates)
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if expected_accepted([mid] * k) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def acceptance_hint(method: str, prompt_ids: Sequence[int], vocab_size: int,
                    base: float) -> float | None:
    """Constant per-position acceptance for a request with this prompt (None: engine default).
    ``base`` is ``equivalent_acceptance`` of the method's default schedule."""
    ids = prompt_ids[-WINDOW:]
    if len(ids) < MIN_TOKENS:
        return None
    structure = _clamp((token_reuse(ids, vocab_size) - REUSE_NOISE) / (REUSE_PROSE - REUSE_NOISE))
    a = base * (SOUP_SHARE + (1.0 - SOUP_SHARE) * structure)
    if method == "ngram":
        repeat = _clamp((ngram_repetition(ids) - REPEAT_FROM) / (1.0 - REPEAT_FROM))
        a += (MAX_ACCEPTANCE - base) * repeat
    return min(MAX_ACCEPTANCE, a)
