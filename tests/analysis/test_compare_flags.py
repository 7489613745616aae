"""A run whose server failed verification is marked in every comparison that includes it: the
`servelab compare` header and lines, the report's comparison table, and the compare and
run_overview views (issue 6). The verdicts are stored by orchestration.verify.record, the code
that `servelab verify` and the matrix use, so the JSON shape read here is the one written there."""
import re
import shutil

import duckdb
import pytest


@pytest.fixture()
def verified_db(synthetic_db, tmp_path):
    from servelab.orchestration.verify import Check, Verdict, record

    db = tmp_path / "verified.duckdb"
    shutil.copy(synthetic_db, db)
    record(db, "syn-gptq", Verdict("gptq_int4", "mismatch",
                                   [Check("precision", "fail", "serves W8A16 through Marlin")], {}))
    record(db, "syn-fp8-a", Verdict("fp8", "verified", [Check("precision", "ok", "native FP8")], {}))
    return db


def test_views_carry_the_verdict(verified_db):
    con = duckdb.connect(str(verified_db), read_only=True)
    try:
        overview = {r[0]: r[1:] for r in con.execute(
            "SELECT run_id, verified, verification_status, flags FROM run_overview").fetchall()}
        flags = dict(con.execute(
            "SELECT DISTINCT run_id, flags FROM compare WHERE metric = 'ttft_p50_ms'").fetchall())
        base_flags = con.execute("SELECT DISTINCT baseline_flags FROM compare "
                                 "WHERE run_id = 'syn-gptq'").fetchall()
    finally:
        con.close()
    verified, status, run_flags = overview["syn-gptq"]
    assert (verified, status, sorted(run_flags)) == (False, "mismatch", ["generator_saturated", "variant_mismatch"])
    assert overview["syn-fp8-a"] == (True, "verified", [])
    assert overview["syn-eagle"] == (False, None, [])  # never checked is not verified
    assert sorted(flags["syn-gptq"]) == ["generator_saturated", "variant_mismatch"]
    assert flags["syn-fp8-a"] == [] and flags["syn-eagle"] == []
    assert base_flags == [([],)]  # the baseline (earliest run, syn-fp8-a) is clean


def test_compare_marks_the_mismatched_group(cli, verified_db, capsys):
    assert cli(["compare", "syn-fp8-a", "syn-gptq", "--db", str(verified_db), "--boot", "20"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("gptq_int4: runs syn-gptq"))
    assert "FLAGGED" in line and "variant_mismatch" in line and "generator_saturated" in line
    assert re.search(r"gptq_int4 \[[a-z_, ]*variant_mismatch", out)  # the column header
    assert "caution: gptq_int4 is flagged variant_mismatch: the server was checked and does NOT run" in out
    assert "fp8 [" not in out and "fp8: runs syn-fp8-a\n" in out  # the verified run is unmarked


@pytest.mark.slow  # draws a whole report (~4 s)
def test_report_comparison_marks_the_mismatched_group(verified_db, tmp_path):
    from servelab.analysis.db import open_for_reading
    from servelab.analysis.report import build_report

    con = open_for_reading(verified_db)
    try:
        page = build_report(con, ["syn-fp8-a", "syn-gptq"], tmp_path / "out", boot=20).read_text()
    finally:
        con.close()
    header = re.search(r"<th>gptq_int4(<span class=\"flag\">[a-z_]+</span>)+</th>", page)
    assert header and '<span class="flag">variant_mismatch</span>' in header.group(0)
    assert "gptq_int4 is flagged variant_mismatch" in page
