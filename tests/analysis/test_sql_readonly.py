"""`servelab sql` reads the results file and nothing else: no ATTACH (READ_WRITE) of another
file, no COPY TO, no file readers, no setting changed back; the views keep working."""
import hashlib
import shutil

import duckdb
import pytest

from servelab.analysis.query import run_sql
from servelab.analysis.views import view_files
from servelab.core.errors import ServelabError


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def victim(tmp_path):
    """Another results file, the one an ATTACH ... (READ_WRITE) once emptied."""
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE requests AS SELECT range AS x FROM range(5)")
    con.close()
    return path


@pytest.fixture()
def db(tmp_path, known_db):
    path = tmp_path / "servelab.duckdb"
    shutil.copy(known_db, path)
    return path


def test_every_view_reads_under_lockdown(db):
    views = [v for f in view_files() for v in f.views]
    assert len(views) >= 5
    for name in views:
        names, _rows = run_sql(db, f"SELECT * FROM {name} LIMIT 3")
        assert names, name
    _, rows = run_sql(db, "SELECT count(*) FROM stage_summary")
    assert rows[0][0] > 0


@pytest.mark.parametrize("statement", [
    "ATTACH '{victim}' AS v (READ_WRITE)",
    "ATTACH '{victim}' AS v",
    "COPY (SELECT 1) TO '{out}'",
    "COPY runs TO '{out}' (FORMAT csv)",
    "EXPORT DATABASE '{outdir}'",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM '{victim}'",
    "SELECT * FROM glob('/etc/*')",
    "SET enable_external_access = true",
    "RESET enable_external_access",
    "SET lock_configuration = false",
    "SET allowed_directories = ['/']",
    "INSTALL httpfs",
    "LOAD httpfs",
])
def test_escapes_fail_clearly_and_change_nothing(db, victim, tmp_path, statement):
    out, outdir = tmp_path / "out.csv", tmp_path / "export"
    before_db, before_victim = _digest(db), _digest(victim)
    sql = statement.format(victim=victim, out=out, outdir=outdir)
    with pytest.raises(ServelabError) as err:
        run_sql(db, sql)
    text = str(err.value)
    assert "servelab sql reads only the results database" in text or "read-only" in text, text
    assert not out.exists() and not outdir.exists()
    assert _digest(db) == before_db and _digest(victim) == before_victim
    check = duckdb.connect(str(victim), read_only=True)
    assert check.execute("SELECT count(*) FROM requests").fetchone()[0] == 5
    check.close()


def test_attach_then_delete_in_one_script_is_refused(db, victim):
    """The reported attack: one script attaching another results file and emptying it."""
    with pytest.raises(ServelabError):
        run_sql(db, f"ATTACH '{victim}' AS v (READ_WRITE); DELETE FROM v.requests;")
    check = duckdb.connect(str(victim), read_only=True)
    assert check.execute("SELECT count(*) FROM requests").fetchone()[0] == 5
    check.close()


def test_writes_to_the_file_itself_stay_refused(db):
    before = _digest(db)
    for sql in ("DELETE FROM runs", "DROP VIEW stage_summary", "CREATE TABLE t (x INT)"):
        with pytest.raises(ServelabError, match="read-only"):
            run_sql(db, sql)
    assert _digest(db) == before


def test_cli_exit_2_with_the_reason(cli, db, capsys):
    assert cli(["sql", "SELECT * FROM read_text('/etc/passwd')", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "disabled by configuration" in err and "reads only the results database" in err
    assert "root:" not in err
