"""The master's live window against the SQL views on the same rows: the request figures (TTFT,
token-view ITL, TPOT, tokens/s, goodput and SLO attainment per class, errors by kind) through the
real writer (its thread, its DuckDB file), the server's state from /metrics scrapes, and the
generator's saturation verdict, each computed by both sides and compared (agreement, not
hand-typed numbers). The LLM tab in Chromium is tests/loadgen/test_web_browser.py's."""
import math
import random
import time
from collections import deque

import duckdb
import orjson
import pytest
from gevent.threadpool import ThreadPool

from servelab.analysis.views import open_results_db
from servelab.loadgen.master import live_figures
from servelab.loadgen.master.accounts import WorkerAccounts
from servelab.loadgen.master.live import LiveWindow
from servelab.loadgen.master.scraper import metric_rows, server_figures, server_state
from servelab.loadgen.master.writer import DbWriter
from servelab.loadgen.messages import StageMessage
from servelab.store import runs as run_flags
from servelab.store.db import Store
from servelab.store.rows import ClassRow, HealthRow, RequestRow, RunRow, StageRow

T0 = 1_700_000_000.0
WINDOW = 100.0
SLOS = {"chat": (300.0, 25.0, 60.0, None), "batch": (None, None, None, 4000.0)}


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def _requests(rng) -> list[RequestRow]:
    rows = []
    for i in range(160):
        cls = rng.choice(["chat", "batch", "free", None])
        sent = T0 + rng.uniform(1, 60)
        ttft = rng.lognormvariate(5, 0.6)
        n = rng.choice([0, 1, 2, 5, 40, 120])
        offsets, t = ([], ttft)
        for _ in range(n):
            offsets.append(t)
            t += rng.choice([0.0, rng.expovariate(1 / 20), rng.uniform(50, 400)])
        tokens = [rng.choice([1, 1, 1, 3, None, 0]) for _ in offsets]
        if i % 7 == 0:
            tokens = tokens[: n // 2]           # fewer counts than chunks: the rest weigh 1
        error = "http_500" if i % 11 == 0 else ("timeout" if i % 17 == 0 else None)
        out = None if i % 9 == 0 else sum(max(k or 1, 1) for k in tokens) + (n - len(tokens))
        rows.append(RequestRow(
            run_id="r", request_id=f"q{i}", worker="w0", worker_seq=i, class_name=cls, stage=0,
            level=4.0, warmup=False, sent_unix=sent,
            first_token_unix=sent + offsets[0] / 1000 if offsets else None,
            last_token_unix=sent + offsets[-1] / 1000 if offsets else None,
            ttft_ms=(offsets[0] if offsets else None) if i % 5 else None,
            e2e_ms=(offsets[-1] if offsets else None) if i % 5 else None,
            chunk_offsets_ms=offsets, chunk_tokens=tokens, output_tokens=out, error_kind=error))
    for i in range(5):   # open-loop arrivals never sent: counted as dropped, not as requests
        rows.append(RequestRow(run_id="r", request_id=f"d{i}", worker="w0", worker_seq=200 + i,
                               class_name="chat", stage=0, warmup=False,
                               scheduled_unix=T0 + 10 + i, error_kind="dropped",
                               arrival_status="dropped"))
    return rows


def _head(store) -> None:
    store.append_rows("runs", [RunRow("r", started_unix=T0, status="completed")])
    store.append_rows("run_classes", [ClassRow("r", c, 1.0, *s) for c, s in SLOS.items()])
    store.append_rows("stages", [StageRow("r", 0, "manual", 4.0, T0, T0, T0, T0 + WINDOW,
                                          T0 + WINDOW)])


def _batch(no: int, rows: list) -> dict:
    return {"run_id": "r", "worker": "w0", "batch": no, "n_rows": len(rows), "health": b"",
            "rows": b"".join(orjson.dumps(r) + b"\n" for r in rows)}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The rows in batches through the real writer; the live window on it, as a run has it."""
    pool = ThreadPool(1)
    writer = DbWriter(pool, open_results_db, str(tmp_path_factory.mktemp("live") / "l.duckdb"),
                      "r", WorkerAccounts(["local"]), lambda *a: None)
    live = LiveWindow(source=writer, window_s=WINDOW)
    live.started_unix = live.requests.started_unix = time.time() - WINDOW   # rates: WINDOW
    writer.call(_head)
    rows = _requests(random.Random(3))
    for no, i in enumerate(range(0, len(rows), 16), 1):
        writer.batch("local", _batch(no, rows[i:i + 16]))
    writer.wait_idle(30)
    yield writer.store.con, rows, live
    writer.close()
    pool.kill()


KEYS = ("requests", "completed", "errors", "dropped", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
        "itl_p99_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tokens_per_s", "requests_per_s",
        "goodput", "slo_attainment")


def _same(a, b) -> bool:
    if a is None or b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None and (b is None or math.isnan(b))
    return a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_live_figures_agree_with_stage_summary(stored):
    con, rows, window = stored
    live = window.figures()
    cur = con.execute("SELECT * FROM stage_summary WHERE run_id = 'r' ORDER BY class_name")
    names = [d[0] for d in cur.description]
    sql = {r["class_name"]: r for r in (dict(zip(names, row)) for row in cur.fetchall())}
    total = sql["(all)"]
    assert total["requests"] > 100 and total["errors"] > 5 and total["itl_p99_ms"] > 0
    wrong = {k: (live[k], total[k]) for k in KEYS if not _same(live[k], total[k])}
    assert not wrong
    assert live["errors_by_kind"] == total["errors_by_kind"]
    for cls, figs in live["classes"].items():
        for key in ("requests", "goodput", "slo_attainment"):
            assert _same(figs[key], sql[cls][key]), (cls, key)
        assert figs["slo_met_requests"] == sql[cls]["slo_met_requests"]
    assert 0 < total["slo_attainment"] < 1          # the SLOs cut: the rule was exercised


def _scrape(i: int) -> str:
    # vLLM's exposition, two engines: gauges summed or averaged, counters summed
    lines = []
    for e in (0, 1):
        lab = f'{{engine="{e}",model_name="m x"}}'
        lines += [f"vllm:num_requests_running{lab} {3 + e + i % 2}",
                  f"vllm:num_requests_waiting{lab} {i}",
                  f"vllm:kv_cache_usage_perc{lab} {0.1 * i + 0.05 * e}",
                  f"vllm:num_preemptions_total{lab} {i * i + e}",
                  f"vllm:prefix_cache_queries_total{lab} {100.0 * i}",
                  f"vllm:prefix_cache_hits_total{lab} {30.0 * i + i * i}",
                  f"vllm:spec_decode_num_drafts_total{lab} {10.0 * i}",
                  f"vllm:spec_decode_num_draft_tokens_total{lab} {30.0 * i}",
                  f"vllm:spec_decode_num_accepted_tokens_total{lab} {12.0 * i + e * i}",
                  f'vllm:time_to_first_token_seconds_bucket{{le="0.1",engine="{e}"}} 5']
    return "# HELP x y\n" + "\n".join(lines) + "\n"


def test_server_state_agrees_with_server_stage_summary(tmp_path):
    con = open_results_db(tmp_path / "m.duckdb")
    store = Store(con)
    store.append_rows("stages", [StageRow("m", 0, "manual", 1.0, T0, T0, T0, T0 + 10, T0 + 10)])
    scrapes = [(T0 + 0.5 + i, _scrape(i)) for i in range(6)]
    for t, text in scrapes:
        con.execute("INSERT INTO server_metrics SELECT * FROM read_json_auto(?)",
                    [str(_ndjson(tmp_path, metric_rows("m", t, text)))])
    live = server_figures([(t, server_state(text)) for t, text in scrapes])
    (row,) = con.execute("SELECT preemptions_per_s, prefix_cache_hit_rate, spec_acceptance_rate, "
                         "spec_mean_acceptance_length FROM server_stage_summary").fetchall()
    assert [live[k] for k in ("preemptions_per_s", "prefix_cache_hit_rate",
                              "spec_acceptance_rate", "spec_mean_acceptance_length")] == \
        pytest.approx(list(row), rel=1e-9)
    (last,) = con.execute("SELECT running, waiting, kv_cache_usage FROM server_timeline "
                          "ORDER BY t_unix DESC LIMIT 1").fetchall()
    assert [live["running"], live["waiting"], live["kv_cache_usage"]] == pytest.approx(list(last))
    store.close()


def _ndjson(tmp_path, data: bytes):
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.json"
    path.write_bytes(data)
    return path


def _both_verdicts(tmp_path, shapes: dict) -> tuple[dict, dict, dict]:
    """Six seconds of each worker's health ``shape``, judged live and by store/runs.py."""
    con = open_results_db(tmp_path / "h.duckdb")
    store = Store(con)
    store.append_rows("stages", [StageRow("h", 0, "manual", 1.0, T0, T0, T0, T0 + 10, T0 + 10)])
    clock = Clock(T0)
    live = LiveWindow(clock=clock)
    live.stage = lambda: StageMessage(0)
    rows = []
    for i in range(6):
        clock.t = T0 + 1 + i
        for worker, shape in shapes.items():
            row = HealthRow("h", worker, clock.t, **shape)
            rows.append(row)
            live.add_health(worker, orjson.loads(orjson.dumps(row)))
    store.append_rows("client_health", rows)
    stored = {s.worker: s.cause for s in run_flags.saturation(con, "h")}
    view = live.view([])["generator"]
    store.close()
    shown = {w: v["cause"] for w, v in view["workers"].items() if v["saturated"]}
    return shown, stored, view


def test_saturation_verdict_is_the_stored_flags_rule(tmp_path):
    """A worker over the loop-lag limit and one over CPU, one busy host: the live verdict and
    store/runs.py's saturation() on the same health rows name the same workers and causes."""
    shapes = {"w0": dict(loop_lag_p99_ms=2.0, cpu_percent=40.0),
              "w1": dict(loop_lag_p99_ms=9.0, cpu_percent=60.0),
              "w2": dict(loop_lag_p99_ms=1.0, cpu_percent=97.0),
              "w3": dict(loop_lag_p99_ms=12.0, cpu_percent=10.0, host_cpu_percent=99.0)}
    shown, stored, view = _both_verdicts(tmp_path, shapes)
    assert shown == stored == {"w1": "generator", "w2": "generator", "w3": "host"}
    assert view["saturated"] and {t["worker"] for t in view["trips"]} == set(stored)


def test_saturation_rule_at_its_limits(tmp_path):
    """At each limit exactly, just past it, with host figures missing: the live window's medians
    through store/runs.py's SQL rule agree with the stored flags."""
    lim, cpu = run_flags.LOOP_LAG_LIMIT_MS, run_flags.CPU_LIMIT
    own = run_flags.OWN_CPU_BUSY
    shapes = {"at_lag": dict(loop_lag_p99_ms=lim, cpu_percent=40.0),
              "past_lag": dict(loop_lag_p99_ms=lim + 1e-6, cpu_percent=40.0),
              "at_cpu": dict(loop_lag_p99_ms=1.0, cpu_percent=cpu),
              "no_cpu": dict(loop_lag_p99_ms=lim * 2),
              "steal_at_busy": dict(loop_lag_p99_ms=lim * 2, cpu_percent=own - 1,
                                    host_steal_percent=run_flags.HOST_BUSY_STEAL),
              "own_at_busy": dict(loop_lag_p99_ms=lim * 2, cpu_percent=own,
                                  host_runnable_per_core=run_flags.HOST_BUSY_RUNNABLE),
              "host_below": dict(loop_lag_p99_ms=lim * 2, cpu_percent=own - 1,
                                 involuntary_switches_per_s=run_flags.HOST_BUSY_SWITCHES - 1)}
    shown, stored, _ = _both_verdicts(tmp_path, shapes)
    assert shown == stored == {"past_lag": "generator", "no_cpu": "generator",
                               "steal_at_busy": "host", "own_at_busy": "generator",
                               "host_below": "generator"}
    # a median the rows cannot carry (orjson writes inf as null) still reaches the rule intact
    assert run_flags.judge_medians(duckdb.connect(), [
        {"loop_lag_p99_ms": math.inf}, {"cpu_percent": 1.0, "host_cpu_percent": math.inf}]) \
        == [(True, "generator"), (False, "host")]


class Rows:
    """A run's stored rows on a fake clock: what the writer gives the live window (its marks,
    its statement), the writes made by hand at chosen times."""

    def __init__(self, tmp_path):
        self.con = open_results_db(tmp_path / "s.duckdb")
        self.store = Store(self.con)
        _head(self.store)
        self.marks = deque([(T0 - 1, 0, 0, 0)])

    def write(self, t: float, rows: list) -> None:
        self.store.append_rows("requests", rows)
        self.marks.append((t, *self.con.execute(
            "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM itl_sketches), 0"
        ).fetchone()))

    def live_figures(self, spans, firsts):
        return live_figures.query(self.con, "r", spans, firsts)


def _row(i: int, t: float, error=None) -> RequestRow:
    offsets = [] if error else [100.0, 120.0, 140.0, 160.0, 180.0]
    return RequestRow(run_id="r", request_id=f"q{i}", worker="w0", worker_seq=i,
                      class_name="batch" if error else "chat", stage=0, warmup=True,
                      sent_unix=t - 1, ttft_ms=offsets[0] if offsets else None,
                      e2e_ms=offsets[-1] if offsets else None, chunk_offsets_ms=offsets,
                      chunk_tokens=[1] * len(offsets), output_tokens=len(offsets) or None,
                      error_kind=error)


def test_series_is_bounded_and_json_clean(tmp_path):
    """400 s of writes, the series thinned to 50 points; every point's figures are the rows
    stored during its step, warm-up included; a poller's increment brings only new points."""
    clock = Clock(T0)
    rows = Rows(tmp_path)
    live = LiveWindow(source=rows, clock=clock, max_points=50)
    for i in range(400):
        clock.t = T0 + i
        rows.write(clock.t, [_row(2 * i, clock.t), _row(2 * i + 1, clock.t, "timeout")])
        live.tick()
        if i % 37 == 0:
            live.view([])      # watched now and then: the points due are computed together
    view = live.view([], since=None)
    series = view["series"]
    assert len(series["t_unix"]) <= 50 and view["step_s"] > 2.0
    assert all(len(v) == len(series["t_unix"]) for v in series.values())
    assert series["ttft_p50_ms"][-1] == 100.0 and series["itl_p50_ms"][-1] > 0
    assert series["requests_per_s"][-1] == pytest.approx(2.0)   # 4 rows in its step
    assert view["now"]["errors_by_kind"] == {"timeout": 10} and view["errors_total"] == 400
    assert view["class_series"]["chat"]["slo_attainment"][-1] == 1.0
    assert "NaN" not in orjson.dumps(view).decode()                  # JSON-able, no NaN
    newer = live.view([], since=series["t_unix"][-2])["series"]["t_unix"]
    assert newer == series["t_unix"][-1:]


def test_a_point_due_while_a_statement_runs_waits_for_the_next(tmp_path):
    """The statement waits on the database thread while the ticker adds the next point: that
    point gets its figures from the next statement, the first keeps its own."""
    clock = Clock(T0)
    rows = Rows(tmp_path)
    live = LiveWindow(source=rows, clock=clock)
    asked = rows.live_figures

    def slow(spans, firsts):   # the ticker runs while this one waits
        got = asked(spans, firsts)
        clock.t += 1.0
        rows.write(clock.t, [_row(1, clock.t)])     # stored during the next point's step
        clock.t += 1.0
        live.tick()
        return got

    clock.t = T0 + 1
    rows.write(clock.t, [_row(0, clock.t)])
    clock.t = T0 + 2.5
    live.tick()                                    # the point at T0 + 2 is due
    rows.live_figures = slow
    live.figures()                                 # ... and the one at T0 + 4 falls due inside
    assert live.series["t_unix"] == [T0 + 2, T0 + 4]
    assert live.series["requests_per_s"] == [0.5, None]
    rows.live_figures = asked
    live.figures()
    assert live.series["requests_per_s"] == [0.5, 0.5]


def test_figures_wait_for_their_rows_and_survive_a_failing_database(tmp_path):
    """A point's figures come with the statement after its step (never a made-up zero before);
    a statement that fails keeps the last figures and the run."""
    clock = Clock(T0)
    rows = Rows(tmp_path)
    live = LiveWindow(source=rows, clock=clock)
    clock.t = T0 + 1
    rows.write(clock.t, [_row(0, clock.t)])
    clock.t = T0 + 2.5
    live.tick()                                           # the point at T0 + 2 is due
    assert live.series["ttft_p50_ms"] == [None]           # not computed yet
    assert live.view([])["series"]["ttft_p50_ms"] == [100.0]
    before = live.figures()
    rows.con.close()
    clock.t = T0 + 5
    assert live.figures() == before                       # a closed database: kept, no raise


# The LLM tab in Chromium (charts drawn from this window through the API, the relabelled stats
# table, the screenshot) is tests/loadgen/test_web_browser.py's manual ramp.
