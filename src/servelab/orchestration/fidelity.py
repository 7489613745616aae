"""Output fidelity: greedy outputs of candidate variants against a baseline on a shipped prompt set.

Each server answers every prompt with temperature 0 and the same seed; the output is tokenized by
the server that produced it (``POST /tokenize``: the model's own tokenizer). Per candidate and
prompt: exact match, first divergence (the token position where the outputs first differ) and a
token-level similarity (``difflib.SequenceMatcher`` ratio). Rows go to the ``fidelity`` table
(defined in store/schema.sql); the ``fidelity_summary`` view (analysis/80_fidelity_summary.sql)
aggregates them per comparison and candidate.
"""
from __future__ import annotations

import difflib
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from servelab.core import credentials, jsonlines
from servelab.core.errors import ServelabError
from servelab.core.paths import project_root
from servelab.core.timeouts import HTTP_PROBE_S, REQUEST, SERVER_STARTUP_S

log = logging.getLogger("servelab.fidelity")
_WARNED: set = set()   # (server, outcome): one warning each, not one per prompt
DEFAULT_PROMPTS = "fidelity/prompts.jsonl"
PROMPT_KEYS = {"id", "category", "prompt", "max_tokens"}

# The table itself is defined once, with the run tables, in src/servelab/store/schema.sql.
COLUMNS = ("fidelity_id", "created_unix", "baseline", "candidate", "backend", "hardware",
           "prompt_set", "prompt_id", "category", "seed", "baseline_tokens", "candidate_tokens",
           "exact_match", "first_divergence", "similarity", "token_source", "baseline_text",
           "candidate_text", "matrix_id")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    prompt: str
    max_tokens: int


@dataclass
class Output:
    text: str
    tokens: list[int] | list[str]
    token_source: str                  # server | words
    error: str | None = None


@dataclass
class Comparison:
    prompt: Prompt
    exact_match: bool
    first_divergence: int | None
    similarity: float
    baseline: Output
    candidate: Output


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    path = Path(path) if path else project_root() / DEFAULT_PROMPTS
    if not path.is_file():
        raise ServelabError(f"{path}: no such prompts file (JSONL: one object per line with "
                            f"id, prompt and optionally category, max_tokens)")
    prompts, seen = [], set()
    for number, item in jsonlines.numbered(path.read_text(encoding="utf-8"), ServelabError,
                                           f"{path}:"):
        where = f"{path}:{number}"
        if not isinstance(item, dict):
            raise ServelabError(f"{where}: found {type(item).__name__}; allowed an object")
        unknown = set(item) - PROMPT_KEYS
        if unknown:
            raise ServelabError(f"{where}: {sorted(unknown)[0]}: unknown key; allowed "
                                f"{', '.join(sorted(PROMPT_KEYS))}")
        pid, text = item.get("id"), item.get("prompt")
        if not isinstance(pid, str) or not pid:
            raise ServelabError(f"{where}: id: found {pid!r}; allowed a non-empty string")
        if pid in seen:
            raise ServelabError(f"{where}: id: found {pid!r} again; ids must be unique")
        if not isinstance(text, str) or not text.strip():
            raise ServelabError(f"{where}: prompt: found {text!r}; allowed a non-empty string")
        max_tokens = item.get("max_tokens", 128)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ServelabError(f"{where}: max_tokens: found {max_tokens!r}; allowed an integer >= 1")
        seen.add(pid)
        prompts.append(Prompt(pid, str(item.get("category", "")), text, max_tokens))
    if not prompts:
        raise ServelabError(f"{path}: no prompts")
    return prompts


def _post(base: str, path: str, body: dict, timeout: float):
    """POST JSON, bounded in time and size; a TokenCountError (a RuntimeError) naming what
    came back for anything but a JSON 2xx answer."""
    from servelab.profiles.tokens import read_json

    return read_json(base, path, body, credentials.headers(), timeout)


def served_model(url: str, timeout: float = HTTP_PROBE_S) -> str:
    from servelab.profiles.tokens import TokenCountError, resolve_model

    try:
        return resolve_model(url, timeout)
    except TokenCountError as exc:
        raise ServelabError(f"{exc}; fidelity asks each server for its model by name: give a "
                            "URL that serves one") from None


def _one(url: str, model: str, prompt: Prompt, seed: int, timeout: float) -> Output:
    from servelab.profiles.tokens import TokenCountError, _shape

    base = url.rstrip("/")
    try:
        answer = _post(base, "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": prompt.prompt}],
            "max_tokens": prompt.max_tokens, "temperature": 0, "seed": seed, "stream": False},
            timeout)
        text = answer["choices"][0]["message"]["content"] or ""
    except (RuntimeError, KeyError, IndexError, TypeError) as exc:
        return Output("", [], "none", error=str(exc))
    try:
        reply = _post(base, "/tokenize", {"model": model, "prompt": text,
                                          "add_special_tokens": False}, timeout)
        return Output(text, list(_shape(base, "/tokenize", reply, "tokens", list)), "server")
    except TokenCountError as exc:   # a server without a usable /tokenize: words compared
        if (base, exc.outcome) not in _WARNED:
            _WARNED.add((base, exc.outcome))
            log.warning("servelab: %s; comparing outputs of %s by words instead (their "
                        "token_source says so)", exc, base)
        return Output(text, text.split(), "words")


def collect(url: str, prompts: list[Prompt], seed: int = 0, parallel: int = 8,
            timeout: float = REQUEST.first_token) -> dict[str, Output]:
    """Greedy outputs of one server for every prompt, keyed by prompt id. A reply is not
    streamed, so its first byte comes when it is complete: the first-token limit bounds it."""
    clean, basic = credentials.split_url(url)
    if basic is not None:   # user:password in the URL: sent as a header, never shown
        credentials.install(credentials.build(url=url)[1])
        url = clean
    model = served_model(url)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        outputs = list(pool.map(lambda p: _one(url, model, p, seed, timeout), prompts))
    return {p.id: out for p, out in zip(prompts, outputs)}


def compare_tokens(a: list, b: list) -> tuple[bool, int | None, float]:
    """(exact match, first differing position or None, similarity ratio)."""
    if a == b:
        return True, None, 1.0
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return False, first, difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def compare(prompts: list[Prompt], baseline: dict[str, Output],
            candidate: dict[str, Output]) -> list[Comparison]:
    rows = []
    for p in prompts:
        b, c = baseline[p.id], candidate[p.id]
        if b.error or c.error:
            exact, first, sim = False, 0, 0.0
        elif b.token_source != c.token_source:
            exact, first, sim = compare_tokens(b.text.split(), c.text.split())
        else:
            exact, first, sim = compare_tokens(b.tokens, c.tokens)
        rows.append(Comparison(p, exact, first, sim, b, c))
    return rows


def summarize(rows: list[Comparison]) -> dict:
    differ = [r.first_divergence for r in rows if not r.exact_match and r.first_divergence is not None]
    return {"prompts": len(rows),
            "exact_match_rate": sum(r.exact_match for r in rows) / len(rows) if rows else None,
            "mean_first_divergence": sum(differ) / len(differ) if differ else None,
            "mean_similarity": sum(r.similarity for r in rows) / len(rows) if rows else None,
            "errors": sum(1 for r in rows if r.baseline.error or r.candidate.error)}


def collect_from_variants(backend: str, variants: list, prompts: list[Prompt], logs: Path, *,
                         hardware: str | None = None, url: str | None = None,
                         startup_timeout_s: float = SERVER_STARTUP_S, seed: int = 0,
                         parallel: int = 8) -> dict[str, dict[str, Output]]:
    """Each variant's server in turn (started, asked, stopped): its greedy outputs by name."""
    from servelab.orchestration import backends

    if credentials.split_url(url)[1] is not None:   # user:password: a header, never printed
        credentials.install(credentials.build(url=url)[1])
        url = credentials.split_url(url)[0]
    outputs = {}
    for variant in variants:
        server = backends.start_server(backend, variant, logs, hardware=hardware, url=url,
                                       suffix="-fidelity")
        try:
            backends.wait_healthy(server, startup_timeout_s)
            print(f"{variant.name}: {len(prompts)} greedy outputs from {server.url}", flush=True)
            outputs[variant.name] = collect(server.url, prompts, seed, parallel)
        finally:
            server.stop()
    return outputs


def compare_and_record(db_path: str | Path, prompts: list[Prompt], outputs: dict[str, dict],
                       baseline: str, *, backend: str, hardware: str | None, prompt_set: str,
                       seed: int, matrix_id: str | None = None) -> tuple[str, dict[str, dict]]:
    """Every other variant's outputs against the baseline's, stored under one new fidelity id;
    returns that id and the summary per candidate."""
    fidelity_id = new_id()
    summaries = {}
    for name, out in outputs.items():
        if name == baseline:
            continue
        rows = compare(prompts, outputs[baseline], out)
        record(db_path, fidelity_id, baseline, name, rows, backend=backend, hardware=hardware,
               prompt_set=prompt_set, seed=seed, matrix_id=matrix_id)
        summaries[name] = summarize(rows)
    return fidelity_id, summaries


def new_id() -> str:
    return time.strftime("fid-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def record(db_path: str | Path, fidelity_id: str, baseline: str, candidate: str,
           rows: list[Comparison], *, backend: str, hardware: str | None, prompt_set: str,
           seed: int, matrix_id: str | None = None) -> None:
    from servelab.analysis.views import open_results_db

    if not rows:
        return
    now = time.time()
    values = [(fidelity_id, now, baseline, candidate, backend, hardware, prompt_set, r.prompt.id,
               r.prompt.category, seed, len(r.baseline.tokens), len(r.candidate.tokens),
               r.exact_match, r.first_divergence, r.similarity,
               r.candidate.token_source if r.candidate.token_source == r.baseline.token_source
               else "words", r.baseline.text, r.candidate.text, matrix_id) for r in rows]
    # One INSERT with a VALUES list: a single statement per comparison, where executemany costs
    # a round trip per row.
    one = "(" + ", ".join("?" * len(COLUMNS)) + ")"
    con = open_results_db(db_path)
    try:
        con.execute(f"INSERT INTO fidelity ({', '.join(COLUMNS)}) VALUES "
                    + ", ".join([one] * len(values)),
                    [v for row in values for v in row])
    finally:
        con.close()


def render_summary(baseline: str, summaries: dict[str, dict]) -> str:
    lines = [f"output fidelity against {baseline} (greedy, same seed)",
             f"  {'candidate':<16}{'prompts':>8}{'exact match':>13}{'first divergence':>18}"
             f"{'similarity':>12}"]
    for name, s in summaries.items():
        div = "-" if s["mean_first_divergence"] is None else f"{s['mean_first_divergence']:.1f} tok"
        lines.append(f"  {name:<16}{s['prompts']:>8}{s['exact_match_rate']:>12.1%} {div:>17}"
                     f"{s['mean_similarity']:>12.3f}"
                     + (f"   ({s['errors']} failed requests)" if s.get("errors") else ""))
    return "\n".join(lines)
