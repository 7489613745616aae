"""`servelab run` end to end: Locust master + 2 workers against the simulator, checked against
the simulator's own per-request accounting."""
import statistics

import pytest

from loadgen_helpers import ROOT, dicts, query, run_against, sim, sim_requests

pytestmark = pytest.mark.slow  # each runs Locust against a real server


# Holds the client's TTFT to within 5 ms of the server's own: a busy neighbour delays the sends.
@pytest.mark.serial
def test_two_workers_against_the_simulator(tmp_path):
    db = tmp_path / "results" / "t.duckdb"
    with sim(tmp_path) as url:
        res = run_against(url, ROOT / "traffic_profiles" / "smoke.yaml", db, "--workers", "2",
                          "--tag", "suite=loadgen")
        server = {r["request_id"]: r for r in sim_requests(url)}

    (run,) = dicts(db, "SELECT * FROM runs")
    assert run["status"] == "completed" and run["workers"] == 2
    assert run["profile_name"] == "smoke" and run["load_kind"] == "concurrency"
    assert run["tags"] == {"suite": "loadgen"} and run["target"] == url
    assert "rows_lost" not in (run["flags"] or [])

    workers = dicts(db, "SELECT * FROM run_workers ORDER BY worker")
    assert [w["worker"] for w in workers] == ["w0", "w1"]
    assert all(w["status"] == "finished" and w["produced"] == w["stored"]
               and w["in_flight_lost"] == 0 for w in workers)
    rows = dicts(db, "SELECT * FROM requests ORDER BY sent_unix")
    assert len(rows) == sum(w["produced"] for w in workers) > 10
    assert {r["worker"] for r in rows} == {"w0", "w1"}
    assert len({(r["worker"], r["worker_seq"]) for r in rows}) == len(rows)

    stages = dicts(db, "SELECT * FROM stages ORDER BY stage")
    assert [(s["stage"], s["kind"], s["level"]) for s in stages] == \
        [(0, "concurrency", 1.0), (1, "concurrency", 4.0)]
    for s in stages:
        # the hold timer starts when the users are there: window = reached + 1 s warm-up + 3 s
        assert s["started_unix"] <= s["reached_unix"] < s["started_unix"] + 5
        assert abs(s["measure_start_unix"] - (s["reached_unix"] + 1.0)) < 1e-6
        assert abs(s["measure_end_unix"] - (s["measure_start_unix"] + 3.0)) < 1e-6
        assert s["measure_end_unix"] <= s["ended_unix"] < s["measure_end_unix"] + 2.5
    assert stages[0]["ended_unix"] <= stages[1]["started_unix"] + 1e-6

    for r in rows:
        assert r["error_kind"] is None, r["error_text"]
        st = stages[r["stage"]]
        assert r["level"] == st["level"]
        # a row carries the stage its worker knew when it sent: the next stage's message (or
        # the drain) may arrive a few ms after the master's boundary; such rows are warm-up
        assert st["started_unix"] <= r["sent_unix"] <= st["ended_unix"] + 0.25
        measured = st["measure_start_unix"] <= r["sent_unix"] < st["measure_end_unix"]
        assert r["warmup"] is (not measured)
        # lengths within the profile's ranges; ignore_eos makes the output exact
        assert 64 <= r["prompt_tokens_target"] <= 256 and 16 <= r["output_tokens_target"] <= 64
        assert r["output_tokens"] == r["output_tokens_target"]
        assert r["prompt_tokens"] == r["prompt_tokens_target"]  # counted by the sim's /tokenize
        assert r["token_source"] == "usage" and r["chunk_token_source"] == "usage"
        assert sum(r["chunk_tokens"]) == r["output_tokens"]
        assert r["finish_reason"] == "length" and r["http_status"] == 200
    # at concurrency 1 only one user exists: its requests never overlap
    one = [r for r in rows if r["stage"] == 0]
    assert all(a["done_unix"] <= b["sent_unix"] for a, b in zip(one, one[1:]))

    # Client timings against the server's own accounting of the same requests.
    ttft_diff, chunk_lag, itl_diff = [], [], []
    for r in rows:
        s = server[r["response_id"]]
        assert s["chunk_tokens"] == r["chunk_tokens"]
        assert s["output_tokens"] == r["output_tokens"]
        assert s["arrival"] >= r["sent_unix"] - 0.002      # sent before the server saw it
        ttft_diff.append(r["ttft_ms"] - 1000 * (s["first_token"] - s["arrival"]))
        client_t = [r["sent_unix"] + o / 1000 for o in r["chunk_offsets_ms"]]
        chunk_lag += [1000 * (c - t) for c, t in zip(client_t, s["chunk_times"])]
        gaps_c = [b - a for a, b in zip(r["chunk_offsets_ms"], r["chunk_offsets_ms"][1:])]
        gaps_s = [1000 * (b - a) for a, b in zip(s["chunk_times"], s["chunk_times"][1:])]
        itl_diff += [c - g for c, g in zip(gaps_c, gaps_s)]
    # the client's TTFT also holds the request's trip to the server: a few ms at most
    assert 0 <= statistics.median(ttft_diff) < 5, statistics.median(ttft_diff)
    assert statistics.median(chunk_lag) < 3 and max(chunk_lag) > -1, chunk_lag[:20]
    assert abs(statistics.median(itl_diff)) < 1.0
    assert sorted(abs(d) for d in itl_diff)[int(0.95 * len(itl_diff))] < 8.0

    # recorded beside the requests: server metrics and both workers' health
    assert query(db, "SELECT count(DISTINCT t_unix) FROM server_metrics")[0][0] >= 3
    assert query(db, "SELECT count(*) FROM server_metrics WHERE name = "
                 "'vllm:num_requests_running'")[0][0] >= 3
    assert {w for (w,) in query(db, "SELECT DISTINCT worker FROM client_health")} == \
        {"w0", "w1"}
    # Locust's own statistics: one entry per request, named after the class
    log = next((db.parent / "logs").glob("*/master.log")).read_text()
    line = next(x for x in log.splitlines() if x.split()[:2] == ["POST", "short_chat"])
    assert int(line.split()[2]) == len(rows)
    assert "stage" in res.stdout   # the per-stage summary was printed
