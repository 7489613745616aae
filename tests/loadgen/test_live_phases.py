"""The live window's engine queue and prefill (the LLM tab's, issue 21) from the spans the
master's receiver gets, over a real socket into the real writer and DuckDB file: the live
medians are those of the stored spans (first span of each of this run's requests), repeats and
foreign spans do not count, and the view stays JSON."""
from __future__ import annotations

from types import SimpleNamespace

import duckdb
import orjson

from servelab.loadgen.master.live import LiveWindow
from servelab.loadgen.master.spans_intake import SpanIntake
from test_span_intake import RUN, bodies, finish, post, setup


def test_live_queue_and_prefill_are_the_stored_spans_medians(tmp_path):
    pool, writer, intake = setup(tmp_path)
    now = [1000.0]
    window = LiveWindow(clock=lambda: now[0], window_s=10.0, step_s=2.0)
    intake.close()
    intake = SpanIntake(0, collector=SimpleNamespace(live=window, active=True, writer=writer,
                                                     run_id=RUN))
    intake.begin(RUN, writer)
    b = bodies()
    assert window.view([])["spans"]["spans"] == 0     # nothing yet: no figure, not a zero
    assert window.view([])["spans"]["queue_p50_ms"] is None
    now[0] += 0.5
    for body in b:
        assert post(intake, body)[0] == 200
    assert post(intake, b[3])[0] == 200               # a resend: its spans are duplicates
    finish(pool, writer, intake)
    view = orjson.loads(orjson.dumps(window.view([])))
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    n, q50, q99, p50, p99 = con.execute(
        "SELECT count(*), quantile_cont(1000 * time_in_queue_s, 0.5), "
        "quantile_cont(1000 * time_in_queue_s, 0.99), "
        "quantile_cont(1000 * time_in_model_prefill_s, 0.5), "
        "quantile_cont(1000 * time_in_model_prefill_s, 0.99) FROM server_spans "
        "WHERE NOT duplicate AND request_id IS NOT NULL").fetchone()
    live = view["spans"]
    assert live["spans"] == live["total"] == n >= 30
    assert abs(live["queue_p50_ms"] - q50) < 1e-6 and abs(live["queue_p99_ms"] - q99) < 1e-6
    assert abs(live["prefill_p50_ms"] - p50) < 1e-6 and abs(live["prefill_p99_ms"] - p99) < 1e-6
    # the series gets the step's medians; the window forgets them once they are old
    now[0] += 1.5
    window.tick()
    series = window.view([])["series"]
    assert abs(series["span_prefill_p50_ms"][-1] - p50) < 1e-6
    now[0] += 30.0
    later = window.view([])
    assert later["spans"]["spans"] == 0 and later["spans"]["total"] == n
    assert later["series"]["span_prefill_p50_ms"][-1] is None
