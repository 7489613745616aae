"""servelab predict with the CPU KV-offload tier: its counters land in server_metrics under vLLM's
names (external_prefix_cache_*, kv_offload_total_bytes per transfer_type), so the server views
show the tier's hit rate and transfer volume for a predicted run as for a scraped one."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servelab.analysis.views import open_results_db
from servelab.orchestration.predict import predict
from servelab.specs.variants import load_variant

DATA = Path(__file__).resolve().parent / "data"
VARIANTS = Path(__file__).resolve().parents[2] / "servers" / "variants"


def _small_gpu(tmp_path: Path, name: str) -> Path:
    """The shipped variant on an L4 at 0.8 of its memory (45,840 KV tokens), where 48 six-turn
    conversations outgrow the GPU's KV cache."""
    doc = yaml.safe_load((VARIANTS / f"{name}.yaml").read_text())
    doc["name"] = f"{name}_small"
    doc["serve_args"] = ["--gpu-memory-utilization", "0.8"] + doc["serve_args"]
    path = tmp_path / f"{name}_small.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("offload")
    db = tmp / "p.duckdb"
    runs = {}
    for name in ("cpu_offload", "bf16"):
        variant = load_variant(_small_gpu(tmp, name), environ={})
        assert "0.8" in variant.serve_args
        runs[name] = predict(variant, "L4", DATA / "offload_chat.yaml", db).run_id
    con = open_results_db(db)
    rows = {}
    for name, run_id in runs.items():
        cur = con.execute("SELECT * FROM server_stage_summary WHERE run_id = ?", [run_id])
        cols = [d[0] for d in cur.description]
        rows[name] = dict(zip(cols, cur.fetchone()))
    timeline = con.execute(
        "SELECT sum(offload_load_bytes), sum(offload_store_bytes), max(offload_hit_rate) "
        "FROM server_timeline WHERE run_id = ?", [runs["cpu_offload"]]).fetchone()
    names = con.execute("SELECT DISTINCT name, labels['transfer_type'] FROM server_metrics "
                        "WHERE run_id = ? AND name LIKE 'vllm:kv_offload%' ORDER BY 2",
                        [runs["cpu_offload"]]).fetchall()
    plain_names = con.execute("SELECT count(*) FROM server_metrics WHERE run_id = ? AND name "
                              "LIKE 'vllm:%offload%'", [runs["bf16"]]).fetchone()[0]
    con.close()
    return rows, timeline, names, plain_names


def test_the_tier_shows_its_hits_and_loads_in_the_stage_summary(summary):
    rows, timeline, names, _ = summary
    tiered, plain = rows["cpu_offload"], rows["bf16"]
    assert tiered["offload_queries"] > 0 and tiered["offload_hits"] > 0
    assert 0 < tiered["offload_hit_rate"] <= 1
    assert tiered["offload_load_bytes"] > 0 and tiered["offload_store_bytes"] > 0
    # Loads are the hit tokens' KV: Qwen2.5-7B keeps 56 KiB per token (28 layers x 4 KV heads
    # x 128 x 2 x 2 bytes).
    assert tiered["offload_load_bytes"] == pytest.approx(tiered["offload_hits"] * 57344)
    # The tier serves what the GPU evicted: more prompt tokens come from a cache than without it.
    assert tiered["prefix_hit_rate_any_tier"] > plain["prefix_cache_hit_rate"] + 0.3
    assert timeline[0] > 0 and timeline[1] > 0 and timeline[2] > 0
    assert names == [("vllm:kv_offload_total_bytes_total", "CPU_to_GPU"),
                     ("vllm:kv_offload_total_bytes_total", "GPU_to_CPU")]


def test_without_a_tier_no_offload_series_is_written(summary):
    rows, _, _, plain_names = summary
    assert plain_names == 0
    assert rows["bf16"]["offload_hit_rate"] is None and rows["bf16"]["offload_load_bytes"] is None
