"""Output fidelity end to end on simulator processes, and the shipped prompt set."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from servelab.core.errors import ServelabError
from servelab.orchestration.fidelity import compare_tokens, load_prompts

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def test_shipped_prompt_set():
    prompts = load_prompts(REPO / "fidelity/prompts.jsonl")
    assert len(prompts) >= 50
    assert len({p.id for p in prompts}) == len(prompts)
    assert len({p.category for p in prompts}) >= 8
    assert len({p.prompt for p in prompts}) == len(prompts)


def test_prompt_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "prompt": "hi"}\n{"id": "a", "prompt": "again"}\n')
    with pytest.raises(ServelabError, match=r"p.jsonl:2: id: found 'a' again"):
        load_prompts(bad)
    bad.write_text('{"id": "a", "prompt": "hi", "temperature": 1}\n')
    with pytest.raises(ServelabError, match=r"p.jsonl:1: temperature: unknown key"):
        load_prompts(bad)
    bad.write_text('{"id": "a", "prompt": "hi", "max_tokens": 0}\n')
    with pytest.raises(ServelabError, match=r"p.jsonl:1: max_tokens: found 0"):
        load_prompts(bad)


def test_token_comparison():
    assert compare_tokens([1, 2, 3], [1, 2, 3]) == (True, None, 1.0)
    exact, first, sim = compare_tokens([1, 2, 3, 4], [1, 2, 9, 4])
    assert (exact, first) == (False, 2) and sim == pytest.approx(0.75)
    assert compare_tokens([1, 2], [1, 2, 3])[:2] == (False, 2)  # one output stops early


@pytest.mark.slow
def test_fidelity_end_to_end_on_the_simulator(tmp_path, cli):
    db = tmp_path / "f.duckdb"
    code, out, err = cli("fidelity", "--baseline", "bf16", "--candidates", "gptq_int4,tuned",
                         "--prompts", DATA / "fidelity_small.jsonl", "--backend", "sim",
                         "--hardware", "H100", "--db", db, "--parallel", "6",
                         "--logs", tmp_path / "logs")
    assert code == 0, err
    assert "output fidelity against bf16" in out
    con = duckdb.connect(str(db))
    rows = con.execute("SELECT candidate, count(*), avg(exact_match::INT), avg(similarity), "
                       "min(baseline_tokens), min(token_source), max(token_source) "
                       "FROM fidelity GROUP BY candidate ORDER BY candidate").fetchall()
    assert [r[:2] for r in rows] == [("gptq_int4", 6), ("tuned", 6)]
    gptq, tuned = rows
    # tuned runs BF16 kernels: the simulator gives it the baseline's text exactly (a control).
    assert tuned[2] == 1.0 and tuned[3] == 1.0
    # W4A16 departs from the baseline somewhere in 6 x 200 tokens at the simulator's int4 rate.
    assert gptq[2] < 1.0 and 0 < gptq[3] < 1.0
    assert gptq[4] > 10 and gptq[5] == gptq[6] == "server"  # tokenized by the server itself
    diverged = con.execute("SELECT first_divergence, baseline_text, candidate_text FROM fidelity "
                           "WHERE candidate = 'gptq_int4' AND NOT exact_match").fetchall()
    for first, base, cand in diverged:
        assert first >= 0 and base != cand
    con.close()
    assert (tmp_path / "logs" / "gptq_int4-fidelity.log").is_file()
