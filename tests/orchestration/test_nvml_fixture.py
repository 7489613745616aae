"""Real NVML samples from the H200 (bench/h200_gpu_telemetry.sh writes them; the lead vendors
`nvml_samples.jsonl.gz` into tests/orchestration/data/nvml_h200/ with its README): loaded into a
real DuckDB file, the energy counter and the integrated power must tell the same energy. Until
the file is vendored this test says so and skips."""
from __future__ import annotations

import gzip
from pathlib import Path

import duckdb
import orjson
import pytest

from servelab.analysis.views import install_views
from servelab.orchestration.gpu_telemetry import ingest_samples
from servelab.store.db import open_db

FIXTURE = Path(__file__).parent / "data" / "nvml_h200" / "nvml_samples.jsonl.gz"


@pytest.mark.skipif(not FIXTURE.is_file(), reason="real H200 NVML samples not vendored yet "
                    "(run bench/h200_gpu_telemetry.sh on the device)")
def test_real_h200_samples_give_one_energy_either_way(tmp_path):
    raw = tmp_path / "s.jsonl"
    raw.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    rows = [orjson.loads(x) for x in raw.read_bytes().splitlines()]
    t0, t1 = min(r["t_unix"] for r in rows), max(r["t_unix"] for r in rows)
    db = tmp_path / "n.duckdb"
    con = open_db(db)
    con.execute("INSERT INTO runs (run_id, started_unix, finished_unix, status) "
                "VALUES ('r', ?, ?, 'completed')", [t0, t1])
    con.execute("INSERT INTO stages (run_id, stage, kind, level, measure_start_unix, "
                "measure_end_unix) VALUES ('r', 0, 'concurrency', 1, ?, ?)", [t0, t1 + 1])
    assert ingest_samples(con, "r", raw) == len(rows)
    install_views(con)
    assert all("H200" in r["name"] and 30 < r["power_w"] < 800 for r in rows)
    assert all(r["mem_used_mib"] <= 143771 and r["energy_j"] is not None for r in rows)
    energy = [r["energy_j"] for r in sorted(rows, key=lambda r: r["t_unix"])]
    assert energy == sorted(energy)   # the board's counter only grows
    counter = con.execute("SELECT power_mean_w, method FROM gpu_stage_energy").fetchone()
    con.execute("UPDATE gpu_metrics SET energy_j = NULL")
    integrated = con.execute("SELECT power_mean_w, method FROM gpu_stage_energy").fetchone()
    con.close()
    assert counter[1] == "counter" and integrated[1] == "power"
    assert integrated[0] == pytest.approx(counter[0], rel=0.05)
