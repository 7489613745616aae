"""End to end with no GPU: `servelab run` on the simulator (a real simulator process sending its
OTLP spans, a real Locust master with the receiver, a real DuckDB file) gives every request its
server phases, says the clock offset, and prints the phase medians."""
from __future__ import annotations

import pytest
from loadgen_helpers import dicts, query, servelab

ROOT_PROFILE = "traffic_profiles/smoke.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "1"])
def test_every_request_of_a_simulator_run_has_its_phases(tmp_path, workers):
    db = tmp_path / "p.duckdb"
    res = servelab("run", "--profile", ROOT_PROFILE, "--db", str(db), "--quiet",
                   "--workers", workers, timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    (run_id,) = query(db, "SELECT run_id FROM runs")[0]
    (join,) = dicts(db, "SELECT * FROM span_join")
    assert join["requests_sent"] > 5
    assert join["spans"] == join["requests_sent"] == join["spans_matched"]
    assert join["requests_without_span"] == join["spans_without_request"] == 0
    assert join["duplicate_spans"] == 0
    phases = dicts(db, "SELECT * FROM request_phases")
    assert len(phases) == join["requests_sent"] and all(p["has_span"] for p in phases)
    for p in phases:
        assert p["to_server_ms"] >= 0 and p["queue_ms"] >= 0 and p["prefill_ms"] > 0
        assert p["to_client_ms"] >= 0 and p["clock_offset_source"] == "same_host"
        # the simulator's server_other is its delivery lag: small, never negative
        assert -1.0 < p["ttft_residual_ms"] < 200 and p["server_other_ms"] >= -0.01
    stages = dicts(db, "SELECT * FROM phase_stage_summary ORDER BY stage")
    assert [s["level"] for s in stages] == [1.0, 4.0]
    assert all(s["with_span"] == s["requests"] > 0 and s["without_span"] == 0 for s in stages)
    assert "server phases, stage 0 (load 1), medians in ms: network + API server" in out
    assert "server clock offset 0.00 ms (same_host" in out
    (n_spans,) = query(db, "SELECT count(*) FROM server_spans WHERE run_id = ?", [run_id])[0]
    assert n_spans == join["requests_sent"]
