"""Run ids (and worker names) become folder names: every path that takes one checks it the way
`servelab run --run-id` does, and a spool never lands outside --spool-dir."""
import json
import subprocess
import sys

import pytest

from loadgen_helpers import PROFILES, ROOT, _env, servelab
from servelab.core.errors import ServelabError
from servelab.loadgen.options import settings_from
from servelab.store.spool import META, Spool, check_id, read_spool

BAD = ["", ".", "..", "../../x", "a/b", "/abs", "x" * 101, "a b", "run\n", "ä", "..\\x"]
GOOD = ["a", "20260101-120000-abcdef", "x" * 100, "v1.2_rc-3", "..a", "a.."]


@pytest.mark.parametrize("value", BAD)
def test_bad_ids_are_refused_with_the_rule(value):
    with pytest.raises(ServelabError, match=r"1-100 letters, digits"):
        check_id(value, "--run-id")


@pytest.mark.parametrize("value", GOOD)
def test_good_ids_pass(value):
    assert check_id(value) == value


def test_spool_refuses_ids_that_leave_the_root(tmp_path):
    root = tmp_path / "spool"
    for run_id, worker in (("../../x", "w0"), ("..", "w0"), ("r", "../w0"), ("r", "a/b")):
        with pytest.raises(ServelabError):
            Spool(root, run_id, worker)
    assert not any(tmp_path.glob("x")) and list(tmp_path.iterdir()) == []


def test_spool_refuses_a_symlink_out_of_the_root(tmp_path):
    root, outside = tmp_path / "spool", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "r").symlink_to(outside)
    with pytest.raises(ServelabError, match="outside --spool-dir"):
        Spool(root, "r", "w0")
    assert list(outside.iterdir()) == []


def test_spool_stays_under_its_root(tmp_path):
    spool = Spool(tmp_path / "spool", "r1", "w0")
    spool.close()
    assert spool.dir == (tmp_path / "spool" / "r1" / "w0").resolve()


def test_locust_option_is_checked():
    class Opts:
        run_id = "../../x"

    with pytest.raises(ServelabError, match="--run-id '../../x'"):
        settings_from(Opts())
    Opts.run_id = "fine-1"
    assert settings_from(Opts()).run_id == "fine-1"


def test_ingest_refuses_a_spool_whose_meta_names_a_bad_run(tmp_path):
    spool = Spool(tmp_path / "spool", "r1", "w0")
    spool.close()
    meta = json.loads((spool.dir / META).read_text())
    (spool.dir / META).write_text(json.dumps(dict(meta, run_id="../../evil")))
    with pytest.raises(ServelabError, match="meta.json: run_id"):
        read_spool(spool.dir)
    res = servelab("ingest", str(spool.dir), "--db", str(tmp_path / "t.duckdb"))
    assert res.returncode == 2, res.stderr
    assert "meta.json: run_id '../../evil'" in res.stderr and "Traceback" not in res.stderr


def test_servelab_run_refuses_dot_dot(tmp_path):
    res = servelab("run", "--profile", str(PROFILES / "long_closed.yaml"), "--run-id", "..",
                   "--db", str(tmp_path / "t.duckdb"), "--target", "http://127.0.0.1:9")
    assert res.returncode == 2
    assert "--run-id '..'" in res.stderr and "Traceback" not in res.stderr


def test_plain_locust_run_id_cannot_escape_the_spool_dir(tmp_path):
    """`locust -f loadtests/locustfile.py --run-id ../../x` once wrote its spool two folders up."""
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    spool = work / "spool"
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
           "--headless", "--host", "http://127.0.0.1:9", "--profile",
           str(PROFILES / "long_closed.yaml"), "--db", str(work / "t.duckdb"),
           "--spool-dir", str(spool), "--run-id", "../../x", "--only-summary"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=_env(), cwd=work)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out[-2000:]
    assert "--run-id '../../x'" in out and "1-100 letters" in out
    assert not (tmp_path / "x").exists() and not (work / "x").exists()
    assert not spool.exists() or not any(spool.rglob("meta.json"))
