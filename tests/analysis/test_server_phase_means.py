"""server_phase_means: the server's own per-request phases from its /metrics histograms: real
vLLM 0.26 pages scraped around a run (real DuckDB file, the project's scraper rows), and the
simulator in SGLang's dialect under a real `servelab run`."""
from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import orjson
import pytest

from servelab.analysis.views import install_views
from servelab.loadgen.master.scraper import metric_rows
from servelab.store.db import open_db

DATA = Path(__file__).parent / "data" / "vllm_metrics_h200"
REPO = Path(__file__).resolve().parents[2]


def _page(name: str) -> str:
    return gzip.decompress((DATA / name).read_bytes()).decode()


def _value(page: str, sample: str) -> float:
    return float(re.search(rf"^{re.escape(sample)}\{{[^}}]*\}} (\S+)$", page, re.M).group(1))


def test_real_vllm_pages_give_the_phase_means_of_the_window(tmp_path):
    before, after = _page("cap_chat_before.prom.gz"), _page("cap_chat_after.prom.gz")
    con = open_db(tmp_path / "m.duckdb")
    con.execute("INSERT INTO runs (run_id, started_unix, status) VALUES ('r', 0, 'completed')")
    con.execute("INSERT INTO stages (run_id, stage, kind, level, measure_start_unix, "
                "measure_end_unix) VALUES ('r', 0, 'concurrency', 64, 100, 300)")
    rows = metric_rows("r", 110.0, before) + metric_rows("r", 290.0, after)
    path = tmp_path / "rows.ndjson"
    path.write_bytes(rows)
    con.execute(f"INSERT INTO server_metrics SELECT * FROM read_json('{path}', "
                "columns = {'run_id': 'VARCHAR', 't_unix': 'DOUBLE', 'name': 'VARCHAR', "
                "'labels': 'MAP(VARCHAR, VARCHAR)', 'value': 'DOUBLE'})")
    install_views(con)
    got = {r[0]: r[1:] for r in con.execute(
        "SELECT phase, requests, mean_ms FROM server_phase_means WHERE run_id = 'r'").fetchall()}
    con.close()
    assert set(got) == {"queue", "prefill", "decode", "ttft", "e2e"}
    for phase, hist in (("queue", "vllm:request_queue_time_seconds"),
                        ("prefill", "vllm:request_prefill_time_seconds"),
                        ("e2e", "vllm:e2e_request_latency_seconds")):
        n = _value(after, hist + "_count") - _value(before, hist + "_count")
        s = _value(after, hist + "_sum") - _value(before, hist + "_sum")
        assert got[phase][0] == n == 1565
        assert got[phase][1] == pytest.approx(1000 * s / n)
    # the run's own account: 171 ms in the queue and 171 ms of prefill on average
    assert round(got["queue"][1]) == 171 and round(got["prefill"][1]) == 171


@pytest.mark.slow
def test_the_simulator_in_sglang_dialect_reports_queue_and_prefill(tmp_path):
    db = tmp_path / "s.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "run", "--profile",
         str(REPO / "traffic_profiles" / "smoke.yaml"), "--variant", "sglang_bf16",
         "--db", str(db), "--quiet"], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "server /metrics phase means, stage 1" in done.stdout
    con = duckdb.connect(str(db))
    install_views(con)
    rows = con.execute("SELECT stage, phase, histogram, requests, mean_ms FROM server_phase_means "
                       "ORDER BY stage, phase").fetchall()
    iterations = con.execute("SELECT count(*) FROM server_iterations").fetchone()[0]
    ttft = dict(con.execute("SELECT stage, ttft_p50_ms FROM stage_summary "
                            "WHERE class_name = '(all)'").fetchall())
    con.close()
    phases = {(s, p): (h, n, m) for s, p, h, n, m in rows}
    for stage in (0, 1):
        assert phases[(stage, "queue")][0] == "sglang:queue_time_seconds"
        assert phases[(stage, "prefill")][0] == "sglang:per_stage_req_latency_seconds"
        assert all(phases[(stage, p)][1] > 0 for p in ("queue", "prefill", "ttft", "e2e"))
        # queue and prefill are counted when a request finishes, TTFT at its first token: other
        # requests in a short window, so only the coarse order holds
        engine = phases[(stage, "queue")][2] + phases[(stage, "prefill")][2]
        assert 0 < phases[(stage, "prefill")][2] < engine < phases[(stage, "e2e")][2]
        assert 0 < phases[(stage, "ttft")][2] < 1.5 * ttft[stage] + 5
    assert iterations == 0   # SGLang prints no vLLM iteration lines
