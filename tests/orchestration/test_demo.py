"""`servelab demo` end to end on small profiles: real simulator processes driven by Locust for the
measured path, the predict back-end for the predicted one, one real DuckDB file. The answer it
prints last must be what the stored rows say (recomputed here from the file), label both paths,
and open the report together with its figure."""
from __future__ import annotations

import re

import duckdb
import pytest

from .conftest import REPO

DATA = REPO / "tests" / "orchestration" / "data"   # the demo's two small profiles


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    import io
    from contextlib import redirect_stdout

    from servelab.cli import main

    base = tmp_path_factory.mktemp("demo")
    db, out = base / "demo.duckdb", base / "out"
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["demo", "--skip-profiles", "--variants", "bf16,gptq_int4", "--db", str(db),
                     "--out", str(out), "--measured-profile", str(DATA / "demo_measured.yaml"),
                     "--predicted-profile", str(DATA / "demo_predicted.yaml"),
                     "--fidelity", str(DATA / "fidelity_tiny.jsonl")])
    return code, buf.getvalue(), db, out


@pytest.mark.slow
def test_demo_prints_the_answer_its_rows_give(demo):
    from servelab.analysis.answer import read_answer
    from servelab.analysis.answer_text import render_text

    code, printed, db, _ = demo
    assert code == 0, printed[-3000:]
    last = printed[printed.index("4/4  THE ANSWER"):]
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = con.execute("SELECT run_id, variant, list_contains(flags, 'predicted') FROM runs "
                           "ORDER BY started_unix").fetchall()
        assert [(v, p) for _, v, p in runs] == [("bf16", False), ("gptq_int4", False),
                                                ("bf16", True), ("gptq_int4", True)]
        again = render_text(read_answer(con, [r for r, _, _ in runs]))
        fidelity = con.execute("SELECT count(*) FROM fidelity WHERE candidate = 'gptq_int4'").fetchone()[0]
    finally:
        con.close()
    assert again in last  # the screen is the stored rows' answer, not text of its own
    assert fidelity == 4
    assert "PREDICTED in virtual time" in last and "MEASURED: requests sent by Locust" in last
    assert "profile sweep_tiny on L40S, 2-128 users" in last and "profile demo_tiny on L40S, 2 and 6 users" in last
    # The 150 ms TTFT SLO breaks somewhere in the predicted sweep: a load that misses, with its share.
    predicted = last[last.index("PREDICTED in virtual time"):last.index("MEASURED: requests sent")]
    assert re.search(r"misses at (16|128) \(\d+\.\d% within SLO\)", predicted)


@pytest.mark.slow
def test_demo_report_opens_with_the_answer_and_its_figure(demo):
    code, _, _, out = demo
    page = (out / "report.html").read_text()
    body = page[page.index("<body>"):]
    first = body.index("<section")
    assert body.index('<section id="answer">') == first < body.index('id="frontier"')
    answer = body[first:body.index("</section>", first)]
    assert 'data-kind="predicted"' in answer and 'data-kind="measured"' in answer
    assert re.search(r'data-figure="crossover" data-panels="2" data-kinds="predicted,measured"', answer)
    assert (out / "crossover.png").is_file() and (out / "predicted" / "matrix.md").is_file()
    assert (out / "matrix.md").read_text().count("| measured |") == 2


def test_the_demo_starts_its_own_file_afresh_and_keeps_the_last(tmp_path):
    from servelab.commands.demo import _fresh_db

    db = tmp_path / "servelab.duckdb"
    assert _fresh_db(db) == db and not db.exists()
    db.write_text("first")
    (tmp_path / "servelab.duckdb.wal").write_text("first wal")
    assert _fresh_db(db) == db and not db.exists()
    assert (tmp_path / "previous.duckdb").read_text() == "first"
    assert (tmp_path / "previous.duckdb.wal").read_text() == "first wal"
    db.write_text("second")
    _fresh_db(db)
    assert (tmp_path / "previous.duckdb").read_text() == "second"
    assert not (tmp_path / "previous.duckdb.wal").exists()  # the first run's WAL is not the second's
