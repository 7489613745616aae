"""Terminal output that fits: runs, summary and compare at 80 and 120 columns (rich's own width)
show every number and run id whole, hide columns rather than cut them and say so, --wide shows
every column, and --format csv|json carries every column for a pipeline."""
import csv
import io
import json
import re

import duckdb
import pytest
from rich.console import Console

from analysis_rows import k1_rows, k2_rows, merge, results_db
from servelab.analysis.catalogue import format_value
from servelab.analysis.compare import compare_groups, groups_for_runs
from servelab.analysis.summary import (RUN_COLUMNS, STAGE_COLUMNS, print_comparison, print_summary,
                                       run_rows, runs_table, stage_rows)
from servelab.analysis.terminal import print_table

# A matrix run id as long as real ones get (matrix id, variant, repeat).
LONG = "mx20261201-113045-9f3c-gptq_int4_marlin_kv_fp8-r12"


@pytest.fixture(scope="module")
def long_db(tmp_path_factory):
    """K1 and K2 with K1 renamed to a long matrix-style run id."""
    data = merge(k1_rows(), k2_rows())
    for rows in data.values():
        for r in rows:
            if r.get("run_id") == "k1-closed":
                r["run_id"] = LONG
    path = tmp_path_factory.mktemp("long") / "servelab.duckdb"
    results_db(path, data).close()
    return path


def _console(width):
    return Console(width=width, file=io.StringIO(), record=True, color_system=None)


def _text(console):
    return console.export_text(clear=False)


def _lines_fit(text, width):
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, too_long
    assert "…" not in text  # nothing ellipsised


@pytest.mark.parametrize("width", [80, 120])
def test_runs_fit_with_whole_run_ids(long_db, width):
    con = duckdb.connect(str(long_db), read_only=True)
    rows = run_rows(con)
    con.close()
    console = _console(width)
    print_table(console, runs_table(rows, console))
    text = _text(console)
    _lines_fit(text, width)
    words = set(text.split())
    for r in rows:
        assert r["run_id"] in words
        assert str(r["requests"]) in text and str(r["errors"]) in text


def _shown_numbers(text, rows, cols):
    """Every value of a column shown (its header's first word in the table) appears whole."""
    for r in rows:
        for c in cols:
            value = c.fmt(r.get(c.key))
            assert value in text, (c.header, value)


@pytest.mark.parametrize("width", [80, 120])
def test_summary_fits_and_shows_every_number_whole(long_db, width):
    con = duckdb.connect(str(long_db), read_only=True)
    console = _console(width)
    print_summary(con, LONG, console)
    rows = stage_rows(con, LONG)
    con.close()
    text = _text(console)
    _lines_fit(text, width)
    assert LONG in text.split()
    essential = [c for c in STAGE_COLUMNS if not c.optional]
    _shown_numbers(text, rows, essential)
    # each row's figures stand whole on its line: no value split over two lines
    for r in rows:
        value = format_value("ttft_p99_ms", r["ttft_p99_ms"])
        assert any(re.search(rf"(^|\s){re.escape(value)}(\s|$)", line) for line in text.splitlines()), value
    if width == 80:
        assert "--wide" in text  # columns were hidden, and the caption says how to see them


def test_summary_wide_shows_every_column(long_db):
    con = duckdb.connect(str(long_db), read_only=True)
    console = _console(80)
    print_summary(con, LONG, console, wide=True)
    rows = stage_rows(con, LONG)
    con.close()
    text = _text(console)
    assert "--wide" not in text
    _shown_numbers(text, rows, STAGE_COLUMNS)
    assert "…" not in text


def test_runs_number_long_ids_when_narrow(long_db):
    """At 120 columns the ids stand in the table; at 80 a long matrix id beside the kept columns
    does not fit, so rows are numbered and each id is listed whole under the table."""
    con = duckdb.connect(str(long_db), read_only=True)
    rows = run_rows(con)
    con.close()
    narrow, wide = _console(80), _console(120)
    print_table(narrow, runs_table(rows, narrow))
    print_table(wide, runs_table(rows, wide))
    assert any(line.split()[:1] == [LONG] for line in _text(wide).splitlines())
    assert any(line.split() == ["#1", LONG] for line in _text(narrow).splitlines())
    assert RUN_COLUMNS[0].header in _text(wide).split()


@pytest.mark.parametrize("width", [80, 120])
def test_comparison_fits_with_every_group(synthetic_db, width):
    con = duckdb.connect(str(synthetic_db), read_only=True)
    groups = groups_for_runs(con, ["syn-fp8-a", "syn-gptq", "syn-eagle"])
    result = compare_groups(con, groups, boot=20)
    con.close()
    console = _console(width)
    print_comparison(result, console)
    text = _text(console)
    _lines_fit(text, width)
    for stage in result.stages:
        for m in stage.metrics:
            for g in result.groups:
                if g.label in m.values:
                    assert format_value(m.metric, m.values[g.label]) in text, (m.metric, g.label)


def test_cli_formats_and_switches(cli, known_db, synthetic_db, capsys):
    assert cli(["runs", "--db", str(known_db), "--format", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert {r["run_id"] for r in runs} == {"k1-closed", "k2-open"}
    assert cli(["summary", "k1", "--db", str(known_db), "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert table and {"ttft_p99_ms", "itl_p99_ms", "itl_quantile_method"} <= set(table[0])
    assert {r["itl_quantile_method"] for r in table if r["itl_p99_ms"]} == {"ddsketch(1%)"}
    assert cli(["summary", "k1", "--db", str(known_db), "--format", "json", "--exact"]) == 0
    exact = json.loads(capsys.readouterr().out)
    chat = next(r for r in exact if r["stage"] == 0 and r["class_name"] == "chat")
    assert (chat["itl_p50_ms"], chat["itl_p90_ms"], chat["itl_p99_ms"]) == pytest.approx((30.0, 150.0, 200.0))
    assert chat["itl_quantile_method"] == "exact"
    assert cli(["summary", "k1", "--db", str(known_db), "--wide", "--exact"]) == 0
    assert "ITL percentiles exact" in " ".join(capsys.readouterr().out.split())
    assert cli(["compare", "syn-gptq", "syn-eagle", "--boot", "20", "--db", str(synthetic_db),
                "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["group"] for r in records} == {"gptq_int4", "eagle"}
    assert {"value", "ci_low", "ci_high", "ratio", "winner", "within_noise"} <= set(records[0])
