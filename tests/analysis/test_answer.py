"""The demo's answer (analysis/answer.py, answer_text.py, answer_plot.py) over SYNTHETIC runs in a
real DuckDB file: the leaders, the crossover, the frontier and the measured/predicted labels must
follow from the stored rows, so swapping two variants' behaviour swaps the answer, and dropping
the `predicted` flag from the rows relabels the path."""
from __future__ import annotations

import re

import duckdb
import pytest

from analysis_rows import merge, results_db
from analysis_synthetic import Variant, synthetic_run

from servelab.analysis.answer import read_answer
from servelab.analysis.answer_text import answer_blocks, render_html, render_text

# Fast alone, slow in a crowd: its pace grows 1.5 ms per running request, so at 32 users its TPOT
# (~56 ms) breaks the chat class's 40 ms SLO. The other starts slower and barely slows down.
SPRINTER = dict(prefill_ms=50, itl_ms=8, itl_per_batch=1.5, batch=64)
STAYER = dict(prefill_ms=40, itl_ms=12, itl_per_batch=0.2, batch=64)
SWEEP = (1, 2, 8, 16, 32)
CHECK = (2, 16)


def _db(path, alpha: dict, beta: dict, predicted_flag: bool = True):
    """alpha and beta swept in virtual time (flagged predicted) and measured at two loads."""
    flag = ["predicted"] if predicted_flag else []
    data = merge(
        synthetic_run("p-alpha", Variant("alpha", **alpha), SWEEP, profile="sweep", seed=1, flags=flag),
        synthetic_run("p-beta", Variant("beta", **beta), SWEEP, profile="sweep", seed=2, flags=flag,
                      start=1_710_001_000.0),
        synthetic_run("m-alpha", Variant("alpha", **alpha), CHECK, profile="check", seed=3,
                      start=1_710_002_000.0, tags={"backend": "sim"}),
        synthetic_run("m-beta", Variant("beta", **beta), CHECK, profile="check", seed=4,
                      start=1_710_003_000.0, tags={"backend": "sim"}, flags=["host_busy"]))
    results_db(path, data).close()
    return path


RUNS = ["m-alpha", "m-beta", "p-alpha", "p-beta"]  # measured first: the answer orders by the rows


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    base = tmp_path_factory.mktemp("answer")
    out = {}
    for name, (a, b) in {"plain": (SPRINTER, STAYER), "swapped": (STAYER, SPRINTER)}.items():
        con = duckdb.connect(str(_db(base / f"{name}.duckdb", a, b)), read_only=True)
        out[name] = (read_answer(con, RUNS, boot=50), con)
    yield out
    for _, con in out.values():
        con.close()


def _leader_by_level(con, runs: list[str]) -> dict[float, str]:
    """The throughput leader per level straight from stage_summary (not through compare)."""
    rows = con.execute("SELECT s.level, arg_max(r.variant, s.output_tokens_per_s) FROM stage_summary s "
                       "JOIN runs r USING (run_id) WHERE list_contains(?, s.run_id) AND s.class_name = '(all)' "
                       "GROUP BY s.level ORDER BY s.level", [runs]).fetchall()
    return {lv: v for lv, v in rows}


def _said(answer) -> str:
    """Everything the answer says, one line per sentence or row (render_text wraps these)."""
    lines, blocks = answer_blocks(answer)
    return "\n".join(lines + [x for _, head, rows in blocks for x in head + [t for _, t in rows]])


def test_the_terminal_text_is_those_lines_wrapped(answers):
    answer, _ = answers["plain"]
    words = " ".join(render_text(answer).split())
    for line in _said(answer).splitlines():
        assert " ".join(line.split()) in words


def test_paths_are_split_by_the_stored_flag_predicted_first(answers):
    answer, _ = answers["plain"]
    assert [(p.kind, p.profile, sorted(p.labels.values())) for p in answer.paths] == [
        ("predicted", "sweep", ["alpha", "beta"]), ("measured", "check", ["alpha", "beta"])]
    assert answer.paths[0].levels == list(map(float, SWEEP))
    assert answer.paths[1].flags == {"beta": ["host_busy"]}


@pytest.mark.parametrize("name, fast, steady", [("plain", "alpha", "beta"), ("swapped", "beta", "alpha")])
def test_leaders_and_crossover_follow_the_rows(answers, name, fast, steady):
    answer, con = answers[name]
    predicted, measured = answer.paths
    for path in (predicted, measured):
        expected = _leader_by_level(con, path.run_ids)
        assert {x.level: x.winner for x in path.leads["output_tokens_per_s"]} == expected
    # The sprinter leads alone, the stayer in a crowd: one crossover, sprinter -> stayer.
    [cross] = predicted.crossovers()
    assert (cross.was, cross.now) == (fast, steady)
    assert cross.before.level == max(lv for lv, v in _leader_by_level(con, predicted.run_ids).items() if v == fast)
    text = _said(answer)
    assert f"{steady} passes {fast} between {cross.before.level:g} and {cross.after.level:g} users" in text
    assert re.search(rf"highest for {fast} at 1 and 2 users, {steady} at 8-32 users", text)
    assert f"the most output tokens/s from {fast} at 2 users, {steady} at 16 users: the same crossover as predicted" in text


def _exchange(text: str) -> str:
    return text.replace("alpha", "@").replace("beta", "alpha").replace("@", "beta")


def test_swapping_the_variants_swaps_the_answer(answers):
    (plain, _), (swapped, _) = answer_blocks(answers["plain"][0]), answer_blocks(answers["swapped"][0])
    assert plain[0] != swapped[0]
    assert _exchange(plain[0]) == swapped[0]  # the throughput verdict, names exchanged, nothing else
    assert "alpha at 1 and 2 users" in plain[0] and "beta at 1 and 2 users" in swapped[0]


@pytest.mark.parametrize("name, crowded", [("plain", "alpha"), ("swapped", "beta")])
def test_frontier_names_the_load_that_misses_and_its_attainment(answers, name, crowded):
    answer, con = answers[name]
    predicted = answer.paths[0]
    run = predicted.runs_of()[crowded]
    fails = con.execute("SELECT min(level) FROM stage_summary WHERE run_id = ? AND class_name = '(all)' "
                        "AND slo_attainment < 0.95", [run]).fetchone()[0]
    share = con.execute("SELECT min(slo_attainment) FROM stage_summary WHERE run_id = ? AND class_name = '(all)' "
                        "AND level = ?", [run, fails]).fetchone()[0]
    assert fails == 32 and share < 0.6  # the sprinter's TPOT breaks 40 ms at 32 users
    text = _said(answer)
    assert f"{crowded} sustains 16 users, misses at 32 ({100 * share:.1f}% within SLO)" in text
    other = "beta" if crowded == "alpha" else "alpha"
    assert f"{other} meets it at every load tried (up to 32 users): no load tried misses" in text
    assert (f"Predicted SLO frontier: {other} sustains 32 users, the most load tried (no load tried misses); "
            f"{crowded} 16 users (misses at 32: {100 * share:.1f}%)") in text


def test_every_line_says_measured_or_predicted_and_html_repeats_it(answers):
    answer, _ = answers["plain"]
    lines, blocks = answer_blocks(answer)
    assert all(line.startswith(("Predicted", "Measured")) for line in lines)
    assert [head[0].split()[0] for _, head, _ in blocks] == ["PREDICTED", "MEASURED:"]
    page = render_html(answer, "<figure>x</figure>")
    for _, head, rows in blocks:
        for _, text in rows:
            assert text.replace("<", "&lt;").replace("'", "&#x27;") in page
    assert page.index('data-kind="predicted"') < page.index('data-kind="measured"') < page.index("<figure>")
    assert "host_busy" in page


def test_without_the_flag_nothing_is_called_predicted(tmp_path):
    path = _db(tmp_path / "unflagged.duckdb", SPRINTER, STAYER, predicted_flag=False)
    con = duckdb.connect(str(path), read_only=True)
    try:
        answer = read_answer(con, RUNS, boot=50)
    finally:
        con.close()
    assert [p.kind for p in answer.paths] == ["measured", "measured"]
    assert "PREDICTED" not in _said(answer) and "Predicted" not in _said(answer)


def test_the_figure_draws_one_panel_per_path(answers, tmp_path):
    from servelab.analysis.answer_plot import crossover_figure

    answer, _ = answers["plain"]
    png, facts = crossover_figure(answer, tmp_path / "crossover.png")
    assert png.stat().st_size > 10_000
    assert facts == {"panels": 2, "kinds": "predicted,measured", "crossovers": 2, "misses": 1}
