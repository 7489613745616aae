"""Every view against the same figures computed independently in Python from the raw rows
(analysis_expected.py), plus hand-computed values for the small run K1 and the sweep K2."""
import math

import pytest

import analysis_expected as expected
from analysis_rows import T0, T1


def close(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, dict) or isinstance(b, dict):
        return dict(a) == dict(b)
    if isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return a == b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def rows(con, sql, params=None):
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


# The ITL percentiles of stage_summary are sketched (DDSketch, 1% relative; itl_quantile_method):
# they must lie within that bound of the exact figure; everything else is exact.
SKETCH_BOUND = 0.01 * (1 + 1e-9)
SKETCHED = {"itl_p50_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms", "itl_chunk_p50_ms", "itl_chunk_p99_ms"}


def assert_matches(got: dict, want: dict, columns, where: str):
    bad = [(c, got[c], want[c]) for c in columns
           if not close(got[c], want[c], SKETCH_BOUND if c in SKETCHED else 1e-9)]
    assert not bad, f"{where}: (column, view, python) {bad}"


REQUEST_COLUMNS = ["ok", "dropped", "measured", "ttft_ms", "e2e_ms", "tpot_ms", "send_lag_ms", "ttft_sched_ms",
                   "e2e_sched_ms", "n_chunks", "chunk_tokens_total", "tokens_per_chunk", "itl_chunk_mean_ms",
                   "itl_mean_ms", "itl_max_ms", "ttft_slo_met", "tpot_slo_met", "itl_slo_met", "e2e_slo_met",
                   "slo_met"]


def test_request_metrics_match_python(known_con, known_data):
    want = expected.request_metrics(known_data)
    got = rows(known_con, "SELECT * FROM request_metrics")
    assert len(got) == len(want) == len(known_data["requests"])
    for r in got:
        assert_matches(r, want[(r["run_id"], r["request_id"])], REQUEST_COLUMNS, r["request_id"])


def test_request_metrics_hand_computed(known_con):
    r = {x["request_id"]: x for x in rows(known_con, "SELECT * FROM request_metrics WHERE run_id = 'k1-closed'")}
    a2 = r["a2"]  # two chunks of three tokens each after the first
    assert a2["tpot_ms"] == pytest.approx(20.0)
    assert a2["tokens_per_chunk"] == pytest.approx(7 / 3)
    assert a2["itl_chunk_mean_ms"] == pytest.approx(60.0)
    assert a2["itl_mean_ms"] == pytest.approx(20.0)
    assert a2["itl_max_ms"] == pytest.approx(20.0)
    assert a2["slo_met"] is True
    a3 = r["a3"]  # one output token
    assert a3["tpot_ms"] is None and a3["itl_max_ms"] is None
    assert (a3["ttft_slo_met"], a3["tpot_slo_met"], a3["itl_slo_met"], a3["e2e_slo_met"], a3["slo_met"]) == (
        False, True, True, True, False)
    a4 = r["a4"]  # failed request meets no SLO
    assert (a4["ok"], a4["ttft_slo_met"], a4["tpot_slo_met"], a4["itl_slo_met"], a4["e2e_slo_met"], a4["slo_met"]) == (
        False, False, False, False, False, False)
    assert (r["a9"]["ttft_ms"], r["a9"]["e2e_ms"]) == (pytest.approx(150.0, abs=1e-3), pytest.approx(190.0, abs=1e-3))
    assert r["a10"]["tpot_ms"] == pytest.approx(16.0)
    assert r["a7"]["measured"] and not r["a7"]["itl_slo_met"] and not r["a7"]["tpot_slo_met"]
    assert not r["w0"]["measured"] and not r["a8"]["measured"]  # warm-up, cool-down
    assert r["a5"]["ttft_slo_met"] is None and r["a5"]["slo_met"] is True  # batch: E2E SLO only
    assert r["c8"]["ttft_ms"] is None and r["c8"]["ttft_slo_met"] is False  # completed, no output
    o = {x["request_id"]: x for x in rows(known_con, "SELECT * FROM request_metrics WHERE run_id = 'k2-open'")}
    assert o["s1-3"]["send_lag_ms"] == pytest.approx(300.0, abs=1e-3)
    assert o["s1-3"]["e2e_sched_ms"] == pytest.approx(1000.0, abs=1e-3)  # 700 ms E2E + 300 ms lag
    assert o["s2-dropped"]["dropped"] and o["s2-dropped"]["measured"]


def test_chunk_and_itl_views_match_python(known_con, known_data):
    want_chunks = sorted((c["run_id"], c["request_id"], c["chunk_index"], round(c["arrival_unix"], 6), c["tokens"],
                          round(c["usage_tokens"], 9), None if c["gap_ms"] is None else round(c["gap_ms"], 6))
                         for c in expected.chunks(known_data))
    got_chunks = sorted((r[0], r[1], r[2], round(r[3], 6), r[4], round(r[5], 9), None if r[6] is None else round(r[6], 6))
                        for r in known_con.execute(
                            "SELECT run_id, request_id, chunk_index, arrival_unix, tokens, usage_tokens, gap_ms "
                            "FROM chunk_arrivals").fetchall())
    assert got_chunks == want_chunks
    gaps = [c for c in expected.chunks(known_data) if c["gap_ms"] is not None]
    got = sorted((r[0], r[1], r[2], round(r[3], 6), r[4], round(r[5], 6)) for r in known_con.execute(
        "SELECT run_id, request_id, chunk_index, gap_ms, tokens, itl_ms FROM itl_chunks").fetchall())
    assert got == sorted((c["run_id"], c["request_id"], c["chunk_index"], round(c["gap_ms"], 6), c["tokens"],
                          round(c["gap_ms"] / c["tokens"], 6)) for c in gaps)
    # itl_tokens: each chunk gap / k, k times; chunk_first marks one row per chunk
    got = sorted((r[0], r[1], r[2], round(r[3], 6)) for r in known_con.execute(
        "SELECT run_id, request_id, chunk_index, itl_ms FROM itl_tokens").fetchall())
    want = sorted((c["run_id"], c["request_id"], c["chunk_index"], round(c["gap_ms"] / c["tokens"], 6))
                  for c in gaps for _ in range(c["tokens"]))
    assert got == want
    assert known_con.execute("SELECT count(*) FROM itl_tokens WHERE chunk_first").fetchone()[0] == len(gaps)


def test_itl_views_hand_computed(known_con):
    a2_tokens = [r[0] for r in known_con.execute(
        "SELECT itl_ms FROM itl_tokens WHERE request_id = 'a2' ORDER BY chunk_index").fetchall()]
    assert a2_tokens == pytest.approx([20.0] * 6)
    a2_chunks = known_con.execute(
        "SELECT gap_ms, tokens FROM itl_chunks WHERE request_id = 'a2' ORDER BY chunk_index").fetchall()
    assert [(round(g, 6), k) for g, k in a2_chunks] == [(60.0, 3), (60.0, 3)]
    usage = known_con.execute("SELECT list(usage_tokens ORDER BY chunk_index) FROM chunk_arrivals WHERE request_id = 'a10'").fetchone()[0]
    assert usage == pytest.approx([2.0, 2.0, 2.0])  # usage 6 over 3 single-token chunks


SUMMARY_COLUMNS = [
    "kind", "level", "window_s", "requests", "completed", "errors", "errors_by_kind", "dropped", "late",
    "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms", "ttft_p50_adj_ms", "ttft_p90_adj_ms",
    "ttft_p99_adj_ms", "itl_mean_ms", "itl_p50_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms", "itl_chunk_mean_ms",
    "itl_chunk_p50_ms", "itl_chunk_p99_ms", "tpot_mean_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p95_ms",
    "tpot_p99_ms", "e2e_mean_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p95_ms", "e2e_p99_ms", "e2e_p50_adj_ms",
    "e2e_p90_adj_ms", "e2e_p99_adj_ms", "send_lag_p50_ms", "send_lag_p99_ms", "send_lag_max_ms",
    "ttft_sched_p50_ms", "ttft_sched_p99_ms", "e2e_sched_p50_ms", "e2e_sched_p99_ms", "prompt_tokens_mean",
    "output_tokens_mean", "tokens_per_chunk_mean", "cached_prompt_share", "output_tokens_in_window",
    "output_tokens_per_s", "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user", "requests_per_s",
    "completed_per_s", "slo_met_requests", "goodput", "slo_attainment", "ttft_slo_attainment",
    "tpot_slo_attainment", "itl_slo_attainment", "e2e_slo_attainment", "error_rate",
]


def test_stage_summary_matches_python(known_con, known_data):
    want = expected.stage_summary(known_data)
    got = {(r["run_id"], r["stage"], r["class_name"]): r for r in rows(known_con, "SELECT * FROM stage_summary")}
    assert set(got) == set(want)
    for key, r in got.items():
        assert_matches(r, want[key], SUMMARY_COLUMNS, str(key))


def test_stage_summary_hand_computed(known_con):
    s = {(r["stage"], r["class_name"]): r for r in rows(known_con, "SELECT * FROM stage_summary WHERE run_id = 'k1-closed'")}
    chat = s[(0, "chat")]
    assert (chat["requests"], chat["completed"], chat["errors"]) == (8, 6, 2)
    assert dict(chat["errors_by_kind"]) == {"http_500": 1, "stream_cut": 1}
    # TTFT of completed chat requests: 100 120 150 200 250 400
    assert (chat["ttft_p50_ms"], chat["ttft_p90_ms"], chat["ttft_p99_ms"]) == pytest.approx((175.0, 325.0, 392.5), abs=1e-3)
    # adjusted: the two failures are +inf: 100 120 150 200 250 400 inf inf
    assert chat["ttft_p50_adj_ms"] == pytest.approx(225.0, abs=1e-3)
    assert chat["ttft_p90_adj_ms"] == math.inf and chat["ttft_p99_adj_ms"] == math.inf
    # per-token ITL: 20 x6, 30 x3, 40 x3, 100, 100, 200, 200 (sketched: within 1%)
    assert chat["itl_quantile_method"] == "ddsketch(1%)"
    assert (chat["itl_p50_ms"], chat["itl_p90_ms"], chat["itl_p99_ms"]) == pytest.approx((30.0, 150.0, 200.0), rel=SKETCH_BOUND)
    # chunk view: 30 30 30 40 40 40 60 60 100 100 200 200
    assert chat["itl_chunk_p50_ms"] == pytest.approx(50.0, rel=SKETCH_BOUND)
    assert chat["slo_attainment"] == pytest.approx(0.5) and chat["goodput"] == pytest.approx(0.2)
    everything = s[(0, "(all)")]
    # chunks that arrived in [T0+5, T0+25): 2 (warm-up) + 4 + 7 + 1 + 5 + 2 + 3 (of a7) + 2 + 6 = 32
    assert everything["output_tokens_in_window"] == pytest.approx(32.0)
    assert everything["output_tokens_per_s"] == pytest.approx(1.6)
    assert everything["output_tokens_per_s_per_gpu"] == pytest.approx(0.8)
    assert chat["output_tokens_in_window"] == pytest.approx(27.0)
    assert (everything["requests"], everything["slo_met_requests"]) == (9, 5)
    # stage 1: c8 completed without output, so TTFT is over 100 200 300 400 500 1000 -> p50 350
    assert s[(1, "chat")]["completed"] == 7 and s[(1, "chat")]["ttft_p50_ms"] == pytest.approx(350.0, abs=1e-3)
    k2 = {r["stage"]: r for r in rows(known_con, "SELECT * FROM stage_summary WHERE run_id = 'k2-open' AND class_name = '(all)'")}
    assert [k2[i]["slo_attainment"] for i in range(3)] == pytest.approx([1.0, 0.9, 0.5])
    assert (k2[2]["requests"], k2[2]["dropped"]) == (40, 1)
    assert k2[1]["late"] == 1 and k2[1]["send_lag_max_ms"] == pytest.approx(300.0, abs=1e-3)


SERVER_COLUMNS = ["sample_unix", "stage", "measured", "engines", "running", "waiting", "kv_cache_usage",
                  "kv_cache_usage_max", "preemptions", "preemptions_per_s", "prompt_tokens_per_s", "generation_tokens",
                  "generation_tokens_per_s", "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate",
                  "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance_rate",
                  "spec_mean_acceptance_length"]


def test_server_timeline_matches_python(known_con, known_data):
    want = expected.server_timeline(known_data)
    got = {(r["run_id"], r["t_unix"]): r for r in rows(known_con, "SELECT * FROM server_timeline")}
    assert set(got) == set(want)
    for key, r in got.items():
        assert_matches(r, want[key], SERVER_COLUMNS, str(key))


def test_server_timeline_hand_computed(known_con):
    t = {r["t_unix"] - T0: r for r in rows(known_con, "SELECT * FROM server_timeline WHERE run_id = 'k1-closed'")}
    assert t[3]["running"] == 1.0  # the later scrape in the second wins (not the 99 at T0+3.2)
    assert t[10]["spec_acceptance_rate"] == pytest.approx(0.6)
    assert t[10]["spec_mean_acceptance_length"] == pytest.approx(2.8)
    assert t[10]["prefix_cache_hit_rate"] == pytest.approx(0.25)  # (4 + 1) / (10 + 10)
    assert t[30]["prefix_cache_hit_rate"] == pytest.approx(0.4)  # engine 1 restarted: its delta is its new value 0
    assert t[10]["generation_tokens_per_s"] == pytest.approx(150.0)
    assert t[0]["preemptions"] is None  # no previous sample
    o = rows(known_con, "SELECT * FROM server_timeline WHERE run_id = 'k2-open' ORDER BY t_unix")
    assert o[5]["running"] == 1.0 and o[5]["kv_cache_usage"] == pytest.approx(0.1)  # 'vllm_' names read as 'vllm:'


def test_server_stage_summary_matches_python(known_con, known_data):
    want = expected.server_stage_summary(known_data)
    got = {(r["run_id"], r["stage"]): r for r in rows(known_con, "SELECT * FROM server_stage_summary")}
    assert set(got) == set(want)
    columns = ["samples", "running_mean", "running_max", "waiting_mean", "waiting_max", "kv_cache_usage_mean",
               "kv_cache_usage_max", "span_s", "preemptions", "preemptions_per_s", "generation_tokens_per_s",
               "prefix_cache_hit_rate", "spec_acceptance_rate", "spec_mean_acceptance_length"]
    for key, r in got.items():
        assert_matches(r, want[key], columns, str(key))
    s0 = got[("k1-closed", 0)]
    # samples at T0+5.5 .. T0+24.5; preemptions engine 0: 24//5 - 5//5 = 3, engine 1: 24//2 - 5//2 = 10
    assert (s0["samples"], s0["preemptions"], s0["span_s"]) == (20, 13.0, pytest.approx(19.0))
    assert s0["generation_tokens_per_s"] == pytest.approx(150.0)
    assert s0["spec_acceptance_rate"] == pytest.approx(0.6)


def test_client_timeline(known_con, known_data):
    rm = expected.request_metrics(known_data)
    got = {r["t_unix"]: r for r in rows(known_con, "SELECT * FROM client_timeline WHERE run_id = 'k1-closed'")}
    sent = {}
    for m in rm.values():
        if m["run_id"] == "k1-closed" and m["sent_unix"] is not None:
            sent.setdefault(math.floor(m["sent_unix"]), []).append(m)
    tokens = {}
    for c in expected.chunks(known_data):
        if c["run_id"] == "k1-closed":
            s = math.floor(c["arrival_unix"])
            tokens[s] = tokens.get(s, 0) + c["usage_tokens"]
    for second, ms in sent.items():
        row = got[float(second)]
        assert row["requests_sent"] == len(ms)
        assert close(row["ttft_p50_ms"], expected.quantile([m["ttft_ms"] for m in ms if m["ok"]], 0.5))
    for second, n in tokens.items():
        assert got[float(second)]["output_tokens"] == pytest.approx(n)
    assert got[T0 + 6]["cpu_percent_max"] == pytest.approx(50.0)  # the worst worker
    assert got[T0 + 6]["stage"] == 0 and got[T0 + 6]["measured"] and not got[T0 + 2]["measured"]


def test_run_overview(known_con):
    r = {x["run_id"]: x for x in rows(known_con, "SELECT * FROM run_overview")}
    # w2 produced 12 rows, stored 11, and lost 1 request in flight
    assert r["k1-closed"]["flags"] == ["unverified", "rows_lost"]
    assert r["k1-closed"]["rows_lost"] == 2
    assert r["k1-closed"]["requests"] == 20 and r["k1-closed"]["errors"] == 3
    assert r["k2-open"]["flags"] == [] and r["k2-open"]["stages"] == 3


def test_slo_frontier(known_con, known_data):
    want = expected.slo_frontier(known_data)
    got = {(r["run_id"], r["class_name"]): r for r in rows(known_con, "SELECT * FROM slo_frontier")}
    assert set(got) == set(want)
    columns = ["levels", "min_level", "max_level", "max_level_meeting_target", "goodput_at_max_level",
               "first_failing_level", "slo_ttft_ms", "knee_level", "last_level_within_slo", "knee_level_interp"]
    for key, r in got.items():
        assert_matches(r, want[key], columns, str(key))
    k2 = got[("k2-open", "(all)")]
    assert (k2["max_level_meeting_target"], k2["first_failing_level"], k2["knee_level"]) == (2.0, 4.0, 4.0)
    assert k2["knee_level_interp"] == pytest.approx(2 + 150 * 2 / 450)
    assert k2["goodput_at_max_level"] == pytest.approx(1.8)
    loose = rows(known_con, "SELECT * FROM slo_frontier_at(0.5) WHERE run_id = 'k2-open' AND class_name = '(all)'")[0]
    assert loose["max_level_meeting_target"] == 4.0 and loose["first_failing_level"] is None
    assert expected.slo_frontier(known_data, 0.5)[("k2-open", "(all)")]["max_level_meeting_target"] == 4.0


def test_view_windows_use_stage_times(known_con):
    """The measured windows the summary reports are the stages' own."""
    w = known_con.execute("SELECT window_start_unix, window_end_unix, window_s FROM stage_summary "
                          "WHERE run_id = 'k2-open' AND stage = 1 AND class_name = '(all)'").fetchone()
    assert w == (pytest.approx(T1 + 17), pytest.approx(T1 + 27), pytest.approx(10.0))


ITL_CHECK = """
    SELECT q.run_id, q.stage, q.class_name, q.view, q.samples, q.mean_ms, [q.p50_ms, q.p90_ms, q.p95_ms, q.p99_ms],
           CASE q.view WHEN 'token' THEN t.n ELSE c.n END,
           CASE q.view WHEN 'token' THEN t.m ELSE c.m END,
           CASE q.view WHEN 'token' THEN t.qs ELSE c.qs END
    FROM {view} q
    JOIN (SELECT run_id, stage, coalesce(class_name, '(all)') AS class_name, count(*) AS n, avg(itl_ms) AS m,
                 quantile_cont(itl_ms, [0.5, 0.9, 0.95, 0.99]) AS qs
          FROM (SELECT run_id, stage, coalesce(class_name, '(none)') AS class_name, itl_ms FROM itl_tokens WHERE measured AND ok)
          GROUP BY GROUPING SETS ((run_id, stage, class_name), (run_id, stage))) t
      ON t.run_id = q.run_id AND t.stage = q.stage AND t.class_name = q.class_name
    JOIN (SELECT run_id, stage, coalesce(class_name, '(all)') AS class_name, count(*) AS n, avg(gap_ms) AS m,
                 quantile_cont(gap_ms, [0.5, 0.9, 0.95, 0.99]) AS qs
          FROM (SELECT run_id, stage, coalesce(class_name, '(none)') AS class_name, gap_ms FROM itl_chunks WHERE measured AND ok)
          GROUP BY GROUPING SETS ((run_id, stage, class_name), (run_id, stage))) c
      ON c.run_id = q.run_id AND c.stage = q.stage AND c.class_name = q.class_name
"""


def _check_itl_quantiles(con, view="itl_stage_quantiles_exact"):
    """The exact view equals quantile_cont; the sketched one is within its 1% bound of it (counts
    and means exact in both)."""
    rel = 1e-12 if view.endswith("_exact") else SKETCH_BOUND
    rows = con.execute(ITL_CHECK.format(view=view)).fetchall()
    assert rows
    for run, stage, cls, kind, n, mean, got, want_n, want_mean, want in rows:
        assert n == want_n and mean == pytest.approx(want_mean, rel=1e-12), (run, stage, cls, kind)
        assert got == pytest.approx(want, rel=rel, abs=1e-12), (run, stage, cls, kind)
    return len(rows)


def test_itl_stage_quantiles_equal_quantile_cont(known_con, synthetic_db):
    """The two-pass percentiles are quantile_cont exactly, for both ITL views."""
    import duckdb

    assert _check_itl_quantiles(known_con) >= 10
    assert _check_itl_quantiles(known_con, "itl_stage_quantiles") >= 10
    con = duckdb.connect(str(synthetic_db), read_only=True)
    assert _check_itl_quantiles(con) == 4 * 5 * 3 * 2  # runs x stages x (2 classes + all) x views
    assert _check_itl_quantiles(con, "itl_stage_quantiles") == 4 * 5 * 3 * 2
    con.close()


def test_itl_stage_quantiles_ties_zeros_and_bin_edges(tmp_path):
    """Zero gaps, many equal gaps, values exactly on bin edges (powers of two) and tiny values."""
    from analysis_rows import k1_rows, request, results_db

    data = k1_rows()
    data["server_metrics"], data["client_health"] = [], []
    offsets = [10.0, 10.0, 10.0, 12.0, 14.0, 16.0, 20.0, 20.0, 28.0, 28.0 + 1e-9, 36.0, 37.0, 37.5, 37.75, 45.75]
    extra = [request("k1-closed", f"z{i}", "chat", 1, 4.0, T0 + 36 + 0.1 * i,
                     [o + 0.5 * i for o in offsets] if i % 2 else offsets, [1 + (j + i) % 3 for j in range(len(offsets))])
             for i in range(7)]
    data["requests"] = data["requests"] + extra
    con = results_db(tmp_path / "edges.duckdb", data)
    assert _check_itl_quantiles(con) >= 8
    assert _check_itl_quantiles(con, "itl_stage_quantiles") >= 8
    stage1 = con.execute("SELECT p50_ms FROM itl_stage_quantiles_exact WHERE stage = 1 AND class_name = 'chat' "
                         "AND view = 'chunk'").fetchone()[0]
    gaps = [g for (g,) in con.execute("SELECT gap_ms FROM itl_chunks WHERE stage = 1 AND class_name = 'chat' "
                                      "AND measured AND ok").fetchall()]
    assert stage1 == pytest.approx(expected.quantile(gaps, 0.5))
