"""The live window's engine queue and prefill (the LLM tab's, issue 21) from the spans the
master's receiver gets, over a real socket into the real writer and DuckDB file: the live
medians are the views' SQL over the stored spans (first span of each of this run's requests),
repeats and foreign spans do not count, the series point of their step gets them, and the view
stays JSON."""
from __future__ import annotations

from types import SimpleNamespace

import duckdb
import orjson
from gevent.threadpool import ThreadPool

from servelab.analysis.views import open_results_db
from servelab.loadgen.master.accounts import WorkerAccounts
from servelab.loadgen.master.live import LiveWindow
from servelab.loadgen.master.spans_intake import SpanIntake
from servelab.loadgen.master.writer import DbWriter
from test_span_intake import RUN, bodies, post


def test_live_queue_and_prefill_are_the_stored_spans_medians(tmp_path):
    pool = ThreadPool(1)   # the run's writer, on a file with the views (as the locustfile opens it)
    writer = DbWriter(pool, open_results_db, str(tmp_path / "s.duckdb"), RUN,
                      WorkerAccounts(["local"]), lambda *a: None)
    window = LiveWindow(source=writer, window_s=30.0, step_s=2.0)
    intake = SpanIntake(0, collector=SimpleNamespace(live=window, active=True, writer=writer,
                                                     run_id=RUN))
    intake.begin(RUN, writer)
    b = bodies()
    try:
        assert window.view([])["spans"]["spans"] == 0     # nothing yet: no figure, not a zero
        assert window.view([])["spans"]["queue_p50_ms"] is None
        for body in b:
            assert post(intake, body)[0] == 200
        assert post(intake, b[3])[0] == 200               # a resend: its spans are duplicates
        writer.wait_idle(10)
        window.figures()   # a statement now (a view reuses one younger than VIEW_REFRESH_S)
        view = orjson.loads(orjson.dumps(window.view([])))
        n, q50, q99, p50, p99 = writer.run_now(lambda store: store.con.execute(
            "SELECT count(*), quantile_cont(1000 * time_in_queue_s, 0.5), "
            "quantile_cont(1000 * time_in_queue_s, 0.99), "
            "quantile_cont(1000 * time_in_model_prefill_s, 0.5), "
            "quantile_cont(1000 * time_in_model_prefill_s, 0.99) FROM server_spans "
            "WHERE NOT duplicate AND request_id IS NOT NULL").fetchone())
        live = view["spans"]
        assert live["spans"] == live["total"] == n >= 30
        assert abs(live["queue_p50_ms"] - q50) < 1e-6 and abs(live["queue_p99_ms"] - q99) < 1e-6
        assert abs(live["prefill_p50_ms"] - p50) < 1e-6 and abs(live["prefill_p99_ms"] - p99) < 1e-6
        # the series point of their step gets the medians (once its statement ran)
        window._next_point = window.clock()
        window.tick()
        window.figures()
        assert abs(window.series["span_prefill_p50_ms"][-1] - p50) < 1e-6
        # a later point, with no new spans, has none; the run's total stays
        window._next_point = window.clock()
        window.tick()
        window.figures()
        assert window.series["span_prefill_p50_ms"][-1] is None
        assert window.view([])["spans"]["total"] == n
    finally:
        writer.wait_idle(10)
        intake.close()
        writer.close()
        pool.kill()
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM server_spans WHERE duplicate").fetchone()[0] > 0
