"""Results while a run is on: a real headless Locust master with its JSON API (--api-port)
against the calibration server. During the run `servelab runs`, `summary` and `sql` read the
locked file through the master (its sidecar), the API answers, the token and the read-only rule
hold; after the run the figures of the stage that had ended agree with the final ones."""
import json
import stat
import sys
import urllib.error
import urllib.request

import duckdb
import numpy as np
import pytest

from loadgen_helpers import ROOT, _env, calibration, chat_profile, servelab, wait_for
from servelab.store import read_remote as remote
from servelab.analysis.views import open_results_db
from servelab.core import procs
from servelab.store.read_guard import Guard, Refused
from servelab.store import readers
FIGURES = ("requests", "errors", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "tpot_p50_ms",
           "output_tokens_per_s", "requests_per_s", "goodput")


def _get(url: str, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, body: dict, token: str | None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _cli_json(*args: str):
    out = servelab(*args, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _stage(rows: list[dict], stage) -> dict:
    return next(r for r in rows if r["stage"] == stage and r["class_name"] == "(all)")


READS = [  # what the analysis code and a user's `servelab sql` send
    "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'",
    "SELECT * FROM stage_summary WHERE run_id = ? ORDER BY stage",
    "WITH r AS (SELECT request_id FROM request_metrics) SELECT * FROM itl_chunks JOIN r USING "
    "(request_id)", "SELECT list_transform([1, 2], x -> x + 1), 'a' LIKE 'a%'",
    "DESCRIBE runs", "SUMMARIZE requests", "FROM runs", "SHOW TABLES",
    "SELECT * FROM information_schema.tables, range(2)"]
REFUSED = ["COPY runs TO 'x.csv'", "ATTACH 'other.duckdb'", "SET threads = 8", "EXPLAIN FROM runs",
           "SELECT * FROM read_csv('/etc/passwd')", "FROM '/etc/passwd'", "DESCRIBE 'x.csv'",
           "SELECT * FROM (WITH \"x.csv\" AS (SELECT 1) SELECT 1), \"x.csv\"",  # out of scope
           "SELECT * FROM query('SELECT 1')", "SELECT current_setting('threads')",
           "SELECT * FROM other.main.runs", "SELECT 1; DELETE FROM runs", "SELECT st_point(1, 2)"]
TYPED = ("SELECT 1.25::DECIMAL(6,2) AS d, x, [1, NULL] AS l, MAP {'a': [1.5]} AS m, "
         "{'k': 'nan'::DOUBLE} AS s, TIMESTAMP '2026-01-02 03:04:05.25' AS t, DATE '2026-01-02' "
         "AS dt, INTERVAL 3 DAY AS i, 'ab'::BLOB AS b, i::INTEGER AS n, i % 2 = 0 AS ok "
         "FROM (VALUES (NULL::DOUBLE, 1), ('inf'::DOUBLE, 2), (2.5, NULL)) v(x, i)")


def test_read_rule_and_typed_results_on_a_results_file(tmp_path):
    con = open_results_db(tmp_path / "g.duckdb")
    guard = Guard(con.cursor())
    for sql in READS:
        guard.check(sql)
    for sql in REFUSED:
        with pytest.raises(Refused, match="cannot|not a table|only this database"):
            guard.check(sql)
    # the master's encoding, then the reader's decoding, give DuckDB's own values and arrays
    cur = con.execute(TYPED)
    types = [str(d[1]) for d in cur.description]
    want = cur.fetchall()
    wire = json.dumps({"columns": [[d[0], t] for d, t in zip(cur.description, types)],
                       "rows": readers.encode_rows(want, types)}, allow_nan=False)
    got = readers.decode(wire)
    result = remote.RemoteResult(got["columns"], got["rows"])
    assert repr(result.fetchall()) == repr(want)
    arrays = remote.RemoteResult(got["columns"], got["rows"]).fetchnumpy()
    for name, direct in con.execute(TYPED).fetchnumpy().items():
        if direct.dtype != object:
            assert arrays[name].dtype == direct.dtype, name
            assert np.ma.allequal(arrays[name], direct) and \
                (np.ma.getmaskarray(arrays[name]) == np.ma.getmaskarray(direct)).all(), name
    con.close()


@pytest.mark.slow
def test_results_during_a_run_through_the_master(tmp_path):
    db = tmp_path / "r.duckdb"
    profile = tmp_path / "two.yaml"
    # a short first level, then one that outlasts the checks (the test stops the run itself)
    profile.write_text(chat_profile("two", "two levels for the API test", (10, 30), (5, 12),
                                    2, "1s").replace(
        "  concurrency: {levels: [2], warmup: 0s, hold: 1s}",
        "  ramp: {stages: [{users: 2, spawn_rate: 100, duration: 3s},"
        " {users: 4, spawn_rate: 100, duration: 20s}]}"))
    port = procs.free_port()
    api = f"http://127.0.0.1:{port}/servelab/api"
    with calibration(tmp_path, "--ttft-ms", "10", "--itl-ms", "3") as url:
        proc = procs.spawn("locust", [
            sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
            "--headless", "--only-summary", "--host", url, "--profile", str(profile),
            "--db", str(db), "--spool-dir", str(tmp_path / "spool"), "--api-port", str(port)],
            tmp_path / "locust.log", env=_env(), cwd=ROOT)
        try:
            # well into the second level: the first one has ended and its rows are stored
            status = wait_for(lambda: _in_second_stage(api), 40, "the second stage")
            run_id = status["run_id"]
            side = readers.find(db)
            assert side and side["run_id"] == run_id and side["url"] == api
            assert stat.S_IMODE(readers.sidecar_path(db).stat().st_mode) == 0o600

            runs = _cli_json("runs", "--db", str(db))
            assert [(r["run_id"], r["status"]) for r in runs] == [(run_id, "running")]
            during = _stage(_cli_json("summary", run_id[:10], "--db", str(db)), 0)
            code, live = _get(api + "/live")
            assert code == 200 and live["run_id"] == run_id and live["state"] == "running"
            code, listed = _get(api + "/runs")
            assert code == 200 and [r["run_id"] for r in listed["runs"]] == [run_id]
            code, staged = _get(f"{api}/runs/{run_id}/stages")
            assert code == 200 and staged["run_id"] == run_id
            assert {k: _stage(staged["stages"], 0)[k] for k in FIGURES} == \
                {k: during[k] for k in FIGURES}
            assert during["requests"] > 0

            # the token, and nothing but reads of this database
            query = {"sql": "SELECT count(*) FROM runs"}
            assert _post(api + "/query", query, None)[0] == 403
            assert _post(api + "/query", query, "not-the-token")[0] == 403
            copy = tmp_path / "leak.csv"
            refused = servelab("sql", f"COPY runs TO '{copy}'", "--db", str(db))
            assert refused.returncode != 0 and "cannot run through the master" in refused.stderr
            refused = servelab("sql", f"SELECT * FROM read_text('{profile}')", "--db", str(db))
            assert refused.returncode != 0 and "read_text()" in refused.stderr
            assert not copy.exists()
            # types survive the trip (what `servelab sql` and the analysis code receive)
            con = remote.connect(db)
            text = ("SELECT 1.25::DECIMAL(6,2) AS d, 'nan'::DOUBLE AS n, [1, NULL] AS l, "
                    "MAP {'a': 1.5} AS m, TIMESTAMP '2026-01-02 03:04:05.25' AS t, ?::VARCHAR AS p")
            (row,) = con.execute(text, ["x"]).fetchall()
            (want,) = duckdb.connect().execute(text, ["x"]).fetchall()
            assert row[1] != row[1] and row[:1] + row[2:] == want[:1] + want[2:]

        finally:
            proc.stop(30)   # SIGTERM: the run drains and ends interrupted
    assert readers.find(db) is None and not readers.sidecar_path(db).exists()
    assert _cli_json("runs", "--db", str(db))[0]["status"] == "interrupted"
    final = _stage(_cli_json("summary", run_id, "--db", str(db)), 0)
    assert {k: final[k] for k in FIGURES} == {k: during[k] for k in FIGURES}


def _in_second_stage(api: str) -> dict | None:
    try:
        code, s = _get(api + "/status")
    except OSError:
        return None   # not listening yet
    if s.get("state") == "running" and s.get("stage") == 1 and s.get("stage_started_unix") \
            and s["t_unix"] - s["stage_started_unix"] > 1.5:
        return s
    return None
