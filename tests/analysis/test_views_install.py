"""Installing the views: persisted in the file (plain duckdb CLI can use them), refreshed when a
view file changes, installed by readers when missing, and clear errors for locks and bad input."""
import shutil
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from analysis_rows import create_db, insert, k1_rows
from servelab.analysis.db import open_for_reading, resolve_run
from servelab.analysis.views import install_views, stale_views, view_files, view_names
from servelab.core.errors import ServelabError
from servelab.core.paths import analysis_dir
from servelab.core.procs import spawn

EXPECTED_VIEWS = {"request_metrics", "chunk_arrivals", "itl_chunks", "itl_tokens", "itl_stage_quantiles", "itl_stage_quantiles_exact", "stage_summary",
                  "client_timeline", "server_metric_names", "server_series", "server_timeline", "server_stage_summary", "run_overview",
                  "compare", "slo_frontier", "fidelity_summary",
                  "span_clock", "request_phases", "span_join", "phase_stage_summary",
                  "gpu_stage_energy", "server_phase_means", "engine_timeline"}


def test_every_view_file_states_its_definition(known_con):
    files = view_files()
    assert set(view_names(files)) == EXPECTED_VIEWS
    for f in files:
        name = f.views[0]
        assert f.definition.startswith(f"{name}:"), f"{f.path.name} must open with '-- {name}: ...'"
    comments = dict(known_con.execute(
        "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal").fetchall())
    assert "quantile_cont" in comments["stage_summary"] and "sha256:" in comments["stage_summary"]
    assert not stale_views(known_con)


def test_duckdb_cli_reads_the_views(known_db, known_con):
    """The views live in the file and use no Python: the duckdb-cli shell (pinned 1.5.6) opens it."""
    shell = Path(sys.executable).with_name("duckdb")
    shell = str(shell) if shell.exists() else shutil.which("duckdb")
    if not shell:
        pytest.skip("the duckdb CLI (PyPI duckdb-cli) is not installed in this environment")
    out = subprocess.run([shell, "-readonly", "-csv", str(known_db), "-c",
                          "SELECT stage, class_name, requests, round(ttft_p50_ms, 3) FROM stage_summary "
                          "WHERE run_id = 'k1-closed' ORDER BY stage, class_name"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = [line.split(",") for line in out.stdout.strip().splitlines()[1:]]
    want = known_con.execute("SELECT stage, class_name, requests, round(ttft_p50_ms, 3) FROM stage_summary "
                             "WHERE run_id = 'k1-closed' ORDER BY stage, class_name").fetchall()
    assert [(int(a), b, int(c), float(d) if d else None) for a, b, c, d in got] == want


def test_changed_view_file_is_detected_and_reinstalled(tmp_path):
    folder = tmp_path / "analysis"
    shutil.copytree(analysis_dir(), folder)
    con = create_db(tmp_path / "db.duckdb")
    install_views(con, folder)
    assert stale_views(con, view_files(folder)) == []
    path = folder / "30_stage_summary.sql"
    path.write_text(path.read_text() + "\n-- edited\n")
    assert stale_views(con, view_files(folder)) == ["stage_summary"]
    install_views(con, folder)
    assert stale_views(con, view_files(folder)) == []


def test_broken_view_file_names_the_file(tmp_path):
    folder = tmp_path / "analysis"
    shutil.copytree(analysis_dir(), folder)
    (folder / "99_broken.sql").write_text("-- broken: a view over a missing column\n"
                                          "CREATE OR REPLACE VIEW broken AS SELECT no_such_column FROM requests;\n")
    con = create_db(tmp_path / "db.duckdb")
    with pytest.raises(ServelabError, match="99_broken.sql"):
        install_views(con, folder)
    # one transaction: nothing of the failed install is left behind
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0] == 0


def _db_without_views(path):
    con = create_db(path)
    insert(con, k1_rows())
    con.close()


def test_reader_installs_missing_views(tmp_path):
    path = tmp_path / "db.duckdb"
    _db_without_views(path)
    con = open_for_reading(path)
    assert con.execute("SELECT count(*) FROM stage_summary").fetchone()[0] > 0
    con.close()
    plain = duckdb.connect(str(path), read_only=True)  # persisted, not temporary
    assert {r[0] for r in plain.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()} == EXPECTED_VIEWS
    plain.close()


HOLDER = textwrap.dedent("""
    import sys, time, duckdb
    from servelab.core.procs import write_ready_file
    con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "ro")
    write_ready_file(sys.argv[3], "holding")
    time.sleep(3600)
""")


@contextmanager
def _hold(path, mode):
    """Another process holding the file (read-write or read-only) until the block ends."""
    ready = path.with_suffix(f".{mode}.ready")
    child = spawn(f"holder-{mode}", [sys.executable, "-c", HOLDER, str(path), mode, str(ready)],
                  path.with_suffix(f".{mode}.log"), ready_file=ready)
    try:
        child.wait_ready(30)
        yield
    finally:
        child.stop()


def test_locked_database_gives_a_clear_error(tmp_path):
    path = tmp_path / "db.duckdb"
    _db_without_views(path)
    with _hold(path, "rw"), pytest.raises(ServelabError, match="locked by another process"):
        open_for_reading(path)


def test_reader_uses_temporary_views_when_another_reader_holds_the_file(tmp_path, capsys):
    path = tmp_path / "db.duckdb"
    _db_without_views(path)
    with _hold(path, "ro"):
        con = open_for_reading(path)
        assert con.execute("SELECT requests FROM stage_summary WHERE stage = 0 AND class_name = 'chat'").fetchone()[0] == 8
        assert "temporary copies" in capsys.readouterr().err
        con.close()


def test_missing_database_and_foreign_file(tmp_path):
    with pytest.raises(ServelabError, match="no database at"):
        open_for_reading(tmp_path / "nope.duckdb")
    duckdb.connect(str(tmp_path / "other.duckdb")).execute("CREATE TABLE t (x INT)").close()
    with pytest.raises(ServelabError, match="no servelab tables"):
        open_for_reading(tmp_path / "other.duckdb")


def test_resolve_run(known_con):
    assert resolve_run(known_con, "k1-closed") == "k1-closed"
    assert resolve_run(known_con, "k2") == "k2-open"
    assert resolve_run(known_con, "latest") == "k2-open"
    with pytest.raises(ServelabError, match="ambiguous"):
        resolve_run(known_con, "k")
    with pytest.raises(ServelabError, match="no run 'zz'"):
        resolve_run(known_con, "zz")


def test_another_server_kind_needs_only_its_names(tmp_path):
    """The server views read canonical names through server_metric_names: rows for a second kind
    (names made up here) give the same figures as vLLM's names do, with no other SQL changed."""
    folder = tmp_path / "analysis"
    shutil.copytree(analysis_dir(), folder)
    names = folder / "38_server_metric_names.sql"
    names.write_text(names.read_text().replace(
        ") AS t(kind, canonical, exposed);",
        ",\n    ('other', 'running', 'other:running_reqs'),\n    ('other', 'kv_usage', 'other:kv_use')\n"
        ") AS t(kind, canonical, exposed);"))
    con = create_db(tmp_path / "db.duckdb")
    data = k1_rows()
    data["server_metrics"] = [
        dict(run_id="k1-closed", t_unix=data["stages"][0]["started_unix"] + i + 0.5, name=name,
             labels={"engine": "0"}, value=value)
        for i in range(3)
        for name, value in ((("vllm:num_requests_running", "other:running_reqs")[i % 2], 2.0 + i),
                            (("vllm:kv_cache_usage_perc", "other_kv_use")[i % 2], 0.1 * i))]
    insert(con, data)
    install_views(con, folder)
    got = con.execute("SELECT running, kv_cache_usage FROM server_timeline ORDER BY t_unix").fetchall()
    assert got == [(2.0, 0.0), (3.0, pytest.approx(0.1)), (4.0, pytest.approx(0.2))]
    assert con.execute("SELECT DISTINCT kind FROM server_metric_names ORDER BY kind").fetchall() == [("other",), ("sglang",), ("vllm",)]
