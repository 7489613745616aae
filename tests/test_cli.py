"""The console script: every subcommand answers --help, and run ids are checked before a run."""
import subprocess
import sys

import pytest

from servelab.cli import COMMAND_MODULES, build_parser, main
from servelab.core.paths import profiles_dir
from servelab.store.db import open_db


def _subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)


def test_every_command_module_registers_something():
    assert len(_subcommands()) >= len(COMMAND_MODULES)


@pytest.mark.parametrize("command", _subcommands())
def test_help_on_each_subcommand(command):
    done = subprocess.run([sys.executable, "-m", "servelab.cli", command, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"servelab {command}" in done.stdout
    assert "usage:" in done.stdout


def test_a_run_id_already_in_the_database_is_refused(tmp_path, capsys):
    db = tmp_path / "r.duckdb"
    con = open_db(db)
    con.execute("INSERT INTO runs (run_id, status) VALUES ('taken', 'completed')")
    con.close()
    status = main(["run", "--profile", str(profiles_dir() / "smoke.yaml"), "--db", str(db),
                   "--run-id", "taken"])
    assert status == 2
    err = capsys.readouterr().err
    assert "--run-id taken" in err and "already has a run" in err


def test_a_malformed_run_id_is_refused(tmp_path, capsys):
    status = main(["run", "--profile", str(profiles_dir() / "smoke.yaml"),
                   "--db", str(tmp_path / "r.duckdb"), "--run-id", "a/b"])
    assert status == 2
    assert "letters, digits" in capsys.readouterr().err


def test_matrix_run_args_become_runner_fields():
    from servelab.commands.run import run_arg_fields
    from servelab.core.errors import ServelabError
    from servelab.core.timeouts import REQUEST

    fields = run_arg_fields(["--workers=2", "--tag", "gpu=l40s", "--timeout-total=5"])
    assert fields == {"workers": 2, "tags": {"gpu": "l40s"},
                      "timeouts": type(REQUEST)(total=5.0)}
    assert run_arg_fields([]) == {}  # nothing given: the matrix's own choices stand
    with pytest.raises(ServelabError, match="--run-arg --no-such-flag"):
        run_arg_fields(["--no-such-flag"])
