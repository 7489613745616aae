"""`servelab matrix --backend external` against a server that asks for an API key: the key from
$OPENAI_API_KEY reaches it (runs succeed, fidelity outputs come back), and an --url with
user:password is recorded and printed without them."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from servelab.core import credentials
from servelab.sim.server.server import start_background

DATA = Path(__file__).resolve().parent / "data"
KEY = "sk-matrix-key-2c9e41"
FAST = dict(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct",
            serve_args=["--max-model-len", "4096", "--api-key", KEY])


@pytest.fixture()
def keyed_sim(monkeypatch):
    saved = credentials._current
    monkeypatch.delenv("SERVELAB_HEADERS", raising=False)
    with start_background(seed=4, **FAST) as bg:
        yield bg
    credentials.install(saved)


@pytest.mark.slow
def test_matrix_external_sends_the_key(tmp_path, cli, keyed_sim, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    credentials.install(None)
    db = tmp_path / "m.duckdb"
    url = keyed_sim.url.replace("http://", "http://user:pw-never-shown@")
    code, out, err = cli("matrix", "--variants", "bf16", "--profile", DATA / "tiny.yaml",
                         "--backend", "external", "--url", url, "--db", db,
                         "--out", tmp_path / "r", "--no-report", "--logs", tmp_path / "logs")
    con = duckdb.connect(str(db), read_only=True)
    try:
        n, ok = con.execute("SELECT count(*), count(*) FILTER (WHERE error_kind IS NULL) "
                            "FROM requests").fetchone()
        (target,) = con.execute("SELECT target FROM runs").fetchone()
    finally:
        con.close()
    assert n > 0 and ok == n, (code, out[-2000:], err[-2000:])   # the key won over user:pw
    assert target == keyed_sim.url
    texts = [out, err] + [p.read_text(errors="replace") for p in tmp_path.rglob("*")
                          if p.is_file() and p.suffix != ".duckdb"]
    assert not [t for t in texts if KEY in t or "pw-never-shown" in t]
