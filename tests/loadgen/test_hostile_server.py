"""servelab's request path against the hostile-server kit (hostile_server.py): every behaviour
gets its documented error_kind, the same over repeats, and every request the server read is a
row (the client runs in a gevent subprocess exactly as inside Locust)."""
import json
import sys
import urllib.request

import pytest

from hostile_server import EXPECTED
from loadgen_helpers import HERE, chat_profile, json_lines, run_script, server

TIMEOUTS = {"first_token_s": 0.6, "between_chunks_s": 0.4, "total_s": 8.0}
SLOW = {"slowloris_head", "slowloris_body", "stall_after_content"}
# Its verdict is the size of one line (over 4 MiB), not time; on a busy machine writing and
# reading 6 MiB may pass the first-token deadline the timing behaviours need short.
ROOMY = {"huge_line": dict(TIMEOUTS, first_token_s=5.0, between_chunks_s=5.0)}


def hostile(tmp_path):
    return server([sys.executable, str(HERE / "hostile_server.py"), "--port", "0"], tmp_path,
                  "hostile")


def seen(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/hostile/seen", timeout=10) as r:
        return json.loads(r.read())


def run_behaviours(tmp_path, names, repeat):
    with hostile(tmp_path) as url:
        # a good answer first: the target then has shown that it echoes the request id
        cases = [{"name": n, "url": url, "headers": {"X-Hostile": n}, "repeat": repeat,
                  "timeouts": ROOMY.get(n, TIMEOUTS)} for n in ["ok", *names]]
        text = run_script(HERE / "client_probe.py", json.dumps(cases), timeout=240)
        assert "Traceback" not in text, text[-3000:]
        results = json_lines(text)
        counts = seen(url)
    rows = [r for r in results if "error_kind" in r]
    by = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r)
    assert [r for r in results if "reactor_streams_left" in r] == [{"reactor_streams_left": 0}]
    for name in ["ok", *names]:
        got = [r["error_kind"] for r in by[name]]
        assert got == [EXPECTED[name]] * repeat, (name, [(r["error_kind"], r["error_text"])
                                                         for r in by[name]])
        assert counts.get(name, 0) == repeat, (name, counts)
    return by


FAST = [n for n in EXPECTED if n not in SLOW and n != "ok"]


def test_every_behaviour_has_its_kind_over_repeats(tmp_path):
    by = run_behaviours(tmp_path, FAST, repeat=2)   # 3 and 10 repeats: the slow test below
    for name, rows in by.items():
        for r in rows:
            if r["error_kind"] is None:
                # a success is timed: every content chunk has its stamp and its tokens
                assert r["ttft_ms"] is not None and len(r["chunk_offsets_ms"]) == 4, name
                assert r["output_tokens"] == 4 and r["chunk_tokens"] == [1] * 4, name
                assert r["response_id"].startswith("chatcmpl-probe-"), name
            assert r["data_quality"] is None or r["error_kind"] is not None, name
        if EXPECTED[name] == "bad_usage":
            assert all(r["data_quality"].startswith("bad_usage: ") for r in rows), name


@pytest.mark.slow
def test_timing_behaviours_and_ten_repeats(tmp_path):
    run_behaviours(tmp_path, sorted(SLOW), repeat=3)
    run_behaviours(tmp_path, FAST, repeat=10)


PROFILE = chat_profile("hostile",
                       "A short closed loop against the hostile-server kit.",
                       (10, 20), (4, 8), 4, "1s")
# through `servelab run`: the worker, the spool, the master's writer, the database
RUN_BEHAVIOURS = ["spaced_json", "usage_completion_3e9", "chunk_count_over_int64",
                  "zero_content_chunks", "bad_chunk_size_with_head", "stray_bytes_keepalive",
                  "second_response", "reset_mid_chunk", "html_200"]


# Three runs at a time against one kit (each has its own behaviour, database, spool and logs):
# most of a run is start-up and drain, which overlap; the kit counts requests per behaviour.
BATCHES = [RUN_BEHAVIOURS[i:i + 3] for i in range(0, len(RUN_BEHAVIOURS), 3)]


@pytest.mark.slow
@pytest.mark.parametrize("names", BATCHES, ids=["-".join(b) for b in BATCHES])
def test_servelab_run_stores_every_request_the_server_saw(tmp_path, names):
    import subprocess

    from loadgen_helpers import ROOT, _env, query
    profile = tmp_path / "hostile.yaml"
    profile.write_text(PROFILE)
    with hostile(tmp_path) as url:
        runs = {}
        for name in names:
            folder = tmp_path / name
            folder.mkdir()
            runs[name] = subprocess.Popen(
                [sys.executable, "-m", "servelab.cli", "run", "--profile", str(profile),
                 "--target", url, "--db", str(folder / "r.duckdb"), "--header",
                 f"X-Hostile: {name}", "--spool-dir", str(folder / "spool"),
                 "--timeout-first-token", "1", "--timeout-between-chunks", "1",
                 "--max-error-rate", "1", "--quiet"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)
        outs = {name: proc.communicate(timeout=180)[0] for name, proc in runs.items()}
        counts = seen(url)
    for name in names:
        folder, out = tmp_path / name, outs[name]
        assert runs[name].returncode == 0, (name, out[-3000:])
        db = folder / "r.duckdb"
        kinds = dict(query(db, "SELECT coalesce(error_kind, 'ok'), count(*) FROM requests "
                               "GROUP BY 1"))
        lost = query(db, "SELECT coalesce(sum(in_flight_lost), 0) FROM run_workers")[0][0]
        assert counts[name] == sum(kinds.values()) + lost, (name, counts, kinds, lost)
        assert set(kinds) == {EXPECTED[name] or "ok"}, (name, kinds)
        logs = [p for p in (folder / "logs").rglob("*") if p.is_file()]
        assert logs, f"{name}: the run wrote no logs where the test looks"
        for text in [out] + [p.read_text(errors="replace") for p in logs]:
            assert "Traceback" not in text, (name, text[-3000:])
