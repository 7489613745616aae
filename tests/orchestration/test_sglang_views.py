"""The server views read SGLang's metrics under the canonical names: the same traffic, scraped
once from a vLLM-named and once from an SGLang-named /metrics, gives the same server_timeline and
server_stage_summary, in a real DuckDB file written through the project's schema."""
from __future__ import annotations

import math
from pathlib import Path

import duckdb

from servelab.analysis.views import install_views
from servelab.core.paths import project_root
from servelab.loadgen.master.scraper import metric_rows

T0 = 1_800_000_000.0
SCHED = ('model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",'
         'dp_rank="{dp}"')
TOK = 'model_name="m",engine_type="unified"'


def _state(i: int) -> dict:
    """Second i of the run: per engine 3 running, 1 waiting, KV use 0.1 + 0.01 i; per second
    1000 prompt tokens (400 from the prefix cache), 200 generated, a preemption every 5 s."""
    return dict(running=3.0, waiting=1.0, kv=0.1 + 0.01 * i, prompt=1000.0 * i, hits=400.0 * i,
                gen=200.0 * i, preempt=float(i // 5))


def _vllm_page(i: int) -> str:
    s, lines = _state(i), []
    for e in ("0", "1"):
        lab = f'engine="{e}",model_name="m"'
        lines += [f"vllm:num_requests_running{{{lab}}} {s['running']}",
                  f"vllm:num_requests_waiting{{{lab}}} {s['waiting']}",
                  f"vllm:kv_cache_usage_perc{{{lab}}} {s['kv']}",
                  f"vllm:num_preemptions_total{{{lab}}} {s['preempt'] / 2}",
                  f"vllm:prompt_tokens_total{{{lab}}} {s['prompt'] / 2}",
                  f"vllm:generation_tokens_total{{{lab}}} {s['gen'] / 2}",
                  f"vllm:prefix_cache_queries_total{{{lab}}} {s['prompt'] / 2}",
                  f"vllm:prefix_cache_hits_total{{{lab}}} {s['hits'] / 2}"]
    return "\n".join(lines) + "\n"


def _sglang_page(i: int) -> str:
    """Names and labels as SGLang 0.5.21's metrics_collector.py writes them (DP 2: one scheduler
    series per dp_rank; the tokenizer's counters split by is_streaming and cache_source)."""
    s, lines = _state(i), []
    for dp in ("0", "1"):
        lab = SCHED.format(dp=dp)
        lines += [f"sglang:num_running_reqs{{{lab}}} {s['running']}",
                  f"sglang:num_queue_reqs{{{lab}}} {s['waiting']}",
                  f"sglang:token_usage{{{lab}}} {s['kv']}",
                  f"sglang:cache_hit_rate{{{lab}}} 0.4",
                  f"sglang:num_retracted_requests_total{{{lab}}} {s['preempt'] / 2}"]
    lines += [f'sglang:prompt_tokens_total{{{TOK},is_streaming="true"}} {s["prompt"] * 0.75}',
              f'sglang:prompt_tokens_total{{{TOK},is_streaming="false"}} {s["prompt"] * 0.25}',
              f'sglang:generation_tokens_total{{{TOK},is_streaming="true"}} {s["gen"]}',
              f'sglang:cached_tokens_total{{{TOK},cache_source="device"}} {s["hits"] * 0.9}',
              f'sglang:cached_tokens_total{{{TOK},cache_source="host"}} {s["hits"] * 0.1}',
              f'sglang:time_to_first_token_seconds_bucket{{{TOK},le="0.1"}} {i}',
              f'sglang:time_to_first_token_seconds_bucket{{{TOK},le="+Inf"}} {i}',
              f"sglang:time_to_first_token_seconds_count{{{TOK}}} {i}",
              f"sglang:time_to_first_token_seconds_sum{{{TOK}}} {0.05 * i}"]
    return ("# TYPE sglang:prompt_tokens_total counter\n# TYPE sglang:time_to_first_token_seconds "
            "histogram\n" + "\n".join(lines) + "\n")


def _db(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    con.execute((project_root() / "src/servelab/store/schema.sql").read_text())
    ndjson = path.with_suffix(".ndjson")
    with ndjson.open("wb") as out:
        for run, page in (("vllm-run", _vllm_page), ("sglang-run", _sglang_page)):
            con.execute("INSERT INTO runs (run_id, started_unix, finished_unix, status) VALUES "
                        "(?, ?, ?, 'completed')", [run, T0, T0 + 30])
            con.execute("INSERT INTO stages VALUES (?, 0, 'concurrency', 8, ?, ?, ?, ?, ?)",
                        [run, T0, T0, T0 + 5, T0 + 25, T0 + 30])
            for i in range(30):   # one scrape a second, as the load generator's scraper does
                out.write(metric_rows(run, T0 + i + 0.5, page(i)))
    con.execute(f"INSERT INTO server_metrics SELECT * FROM read_json('{ndjson}', format = "
                f"'newline_delimited', columns = {{'run_id': 'VARCHAR', 't_unix': 'DOUBLE', "
                f"'name': 'VARCHAR', 'labels': 'MAP(VARCHAR, VARCHAR)', 'value': 'DOUBLE'}})")
    install_views(con)
    return con


def _rows(con, sql: str, run: str) -> list[dict]:
    cur = con.execute(sql, [run])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def test_sglang_and_vllm_metrics_give_the_same_server_views(tmp_path):
    con = _db(tmp_path / "servelab.duckdb")
    for view in ("server_timeline", "server_stage_summary"):
        sql = f"SELECT * EXCLUDE (run_id) FROM {view} WHERE run_id = ? ORDER BY ALL"
        vllm, sglang = _rows(con, sql, "vllm-run"), _rows(con, sql, "sglang-run")
        assert len(sglang) == len(vllm) > 0, view
        for v_row, s_row in zip(vllm, sglang):
            different = {k: (v_row[k], s_row[k]) for k in v_row if not _same(v_row[k], s_row[k])}
            assert not different, (view, different)
    timeline = _rows(con, "SELECT * FROM server_timeline WHERE run_id = ? AND t_rel_s = 10",
                     "sglang-run")
    assert timeline[0]["engines"] == 2 and timeline[0]["running"] == 6.0
    assert math.isclose(timeline[0]["kv_cache_usage"], 0.2)
    assert math.isclose(timeline[0]["prompt_tokens_per_s"], 1000.0)
    assert math.isclose(timeline[0]["prefix_cache_hit_rate"], 0.4)
    summary = _rows(con, "SELECT * FROM server_stage_summary WHERE run_id = ?", "sglang-run")[0]
    assert math.isclose(summary["generation_tokens_per_s"], 200.0)
    assert math.isclose(summary["prefix_cache_hit_rate"], 0.4)
    assert summary["preemptions"] == 3.0 and summary["spec_drafts"] is None
    names = dict(con.execute("SELECT canonical, exposed FROM server_metric_names "
                             "WHERE kind = 'sglang'").fetchall())
    assert names["running"] == "sglang:num_running_reqs"
    assert names["kv_usage"] == "sglang:token_usage"
    con.close()
