"""Runs with known answers, as plain Python rows, and a writer that puts them into a real DuckDB
file through the project's schema.sql. The same rows feed analysis_expected.py, which computes
every view's figures independently in Python.

K1 (closed loop, 2 stages, classes chat + batch) is small enough to check by hand; the comments
give the hand-computed figures that test_known_answers.py asserts literally.
K2 (open loop, a rate sweep 1 -> 2 -> 4 req/s) exercises scheduled times, send lag, late and
dropped arrivals, and the SLO frontier.
"""
from __future__ import annotations

from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "src" / "servelab" / "store" / "schema.sql"

T0 = 1_700_000_000.0  # K1 starts here
T1 = 1_700_001_000.0  # K2 starts here

REQUEST_COLUMNS = [
    "run_id", "request_id", "worker", "worker_seq", "class_name", "stage", "level", "warmup",
    "scheduled_unix", "sent_unix", "first_token_unix", "last_token_unix", "done_unix", "ttft_ms",
    "e2e_ms", "chunk_offsets_ms", "chunk_tokens", "prompt_tokens_target", "prompt_tokens",
    "output_tokens_target", "output_tokens", "token_source", "cached_tokens", "finish_reason",
    "http_status", "error_kind", "error_text", "arrival_status", "prefix_group", "session_id", "turn",
]


def request(run_id, request_id, cls, stage, level, sent, offsets=None, tokens=None, output=None, *,
            warmup=False, error=None, ttft_recorded=True, scheduled=None, arrival_status=None,
            prompt=100, cached=None, worker="w1", seq=0):
    offsets = list(offsets or [])
    if tokens is None:
        tokens = [1] * len(offsets)
    if output is None:
        output = sum(tokens)
    first = sent + offsets[0] / 1000 if (offsets and sent is not None) else None
    last = sent + offsets[-1] / 1000 if (offsets and sent is not None) else None
    return {
        "run_id": run_id, "request_id": request_id, "worker": worker, "worker_seq": seq,
        "class_name": cls, "stage": stage, "level": level, "warmup": warmup,
        "scheduled_unix": scheduled, "sent_unix": sent, "first_token_unix": first,
        "last_token_unix": last, "done_unix": (last + 0.002) if last else (sent + 0.5 if sent else None),
        "ttft_ms": (offsets[0] if offsets else None) if ttft_recorded else None,
        "e2e_ms": (offsets[-1] if offsets else None) if ttft_recorded else None,
        "chunk_offsets_ms": offsets if (offsets or error is None) else None,
        "chunk_tokens": tokens if (offsets or error is None) else None,
        "prompt_tokens_target": prompt, "prompt_tokens": prompt, "output_tokens_target": output,
        "output_tokens": output, "token_source": "usage", "cached_tokens": cached,
        "finish_reason": None if error else "stop", "http_status": 500 if error == "http_500" else 200,
        "error_kind": error, "error_text": f"test {error}" if error else None,
        "arrival_status": arrival_status, "prefix_group": None, "session_id": None, "turn": None,
    }


def k1_rows() -> dict[str, list[dict]]:
    runs = [dict(run_id="k1-closed", started_unix=T0, finished_unix=T0 + 60, profile_name="known",
                 load_kind="concurrency", target="http://127.0.0.1:8000", variant="fp8", hardware="h200",
                 model="m", gpus=2, status="completed", flags=["unverified"], tags={"repeat": "1"})]
    classes = [
        dict(run_id="k1-closed", class_name="chat", weight=0.8, slo_ttft_ms=300.0, slo_tpot_ms=50.0,
             slo_itl_ms=80.0, slo_e2e_ms=3000.0),
        dict(run_id="k1-closed", class_name="batch", weight=0.2, slo_ttft_ms=None, slo_tpot_ms=None,
             slo_itl_ms=None, slo_e2e_ms=10000.0),
    ]
    stages = [
        dict(run_id="k1-closed", stage=0, kind="concurrency", level=2.0, started_unix=T0, reached_unix=T0 + 1,
             measure_start_unix=T0 + 5, measure_end_unix=T0 + 25, ended_unix=T0 + 30),
        dict(run_id="k1-closed", stage=1, kind="concurrency", level=4.0, started_unix=T0 + 30,
             reached_unix=T0 + 31, measure_start_unix=T0 + 35, measure_end_unix=T0 + 55, ended_unix=T0 + 60),
    ]
    r = "k1-closed"
    reqs = [
        # warm-up: left out of every latency, but its 2 chunks at T0+5.5 and T0+6.0 count for throughput
        request(r, "w0", "chat", 0, 2.0, T0 + 2, [100, 2000, 3500, 4000], warmup=True),
        # TTFT 120, E2E 210, TPOT (210-120)/3 = 30, per-token gaps 30,30,30: meets every SLO
        request(r, "a1", "chat", 0, 2.0, T0 + 6, [120, 150, 180, 210]),
        # two chunks of three tokens after the first: chunk gaps 60, 60; per-token 20 x 6;
        # TPOT (370-250)/6 = 20; tokens per chunk 7/3
        request(r, "a2", "chat", 0, 2.0, T0 + 7, [250, 310, 370], [1, 3, 3]),
        # one output token: TPOT undefined (NULL) and met; TTFT 400 > 300 fails the TTFT SLO
        request(r, "a3", "chat", 0, 2.0, T0 + 8, [400]),
        # failed, no chunks: meets no SLO, infinite in the adjusted percentiles
        request(r, "a4", "chat", 0, 2.0, T0 + 9, error="http_500", output=0),
        # batch: only an E2E SLO; per-token gaps 50,50,300,100
        request(r, "a5", "batch", 0, 2.0, T0 + 10, [500, 600, 900, 1000], [1, 2, 1, 1]),
        # stream cut after two chunks: an error, but its tokens arrived inside the window
        request(r, "a6", "chat", 0, 2.0, T0 + 11, [90, 130], error="stream_cut"),
        # sent inside the window, chunks at T0+24.7/.8/.9 (in) and T0+25.1/25.3 (out);
        # TPOT 150 > 50 and a 200 ms gap > 80 fail it
        request(r, "a7", "chat", 0, 2.0, T0 + 24.5, [200, 300, 400, 600, 800]),
        # cool-down: sent after the window, counted nowhere
        request(r, "a8", "chat", 0, 2.0, T0 + 26, [100, 200]),
        # no recorded ttft_ms/e2e_ms: derived from the epoch stamps (150, 190)
        request(r, "a9", "chat", 0, 2.0, T0 + 12, [150, 190], ttft_recorded=False),
        # usage says 6 tokens over 3 single-token chunks: each chunk is worth 2 usage tokens;
        # TPOT (180-100)/5 = 16
        request(r, "a10", "chat", 0, 2.0, T0 + 13, [100, 140, 180], [1, 1, 1], output=6, cached=40),
    ]
    for i, ttft in enumerate([100, 200, 300, 400, 500, 1000]):
        reqs.append(request(r, f"c{i + 1}", "chat", 1, 4.0, T0 + 36 + i, [ttft, ttft + 40, ttft + 80], worker="w2", seq=i))
    reqs.append(request(r, "c7", "chat", 1, 4.0, T0 + 43, error="timeout", output=None))
    # completed with no output at all: no TTFT, counted as a request that misses its TTFT SLO
    reqs.append(request(r, "c8", "chat", 1, 4.0, T0 + 44, [], [], output=0))
    reqs.append(request(r, "b1", "batch", 1, 4.0, T0 + 45, [300, 350]))
    workers = [
        dict(run_id=r, worker="w1", host="h", produced=10, stored=10, in_flight_lost=0, status="finished", spool_path=None),
        dict(run_id=r, worker="w2", host="h", produced=12, stored=11, in_flight_lost=1, status="finished", spool_path=None),
    ]
    metrics = []
    for i in range(60):
        t = T0 + 0.5 + i
        for engine in ("0", "1"):
            labels = {"engine": engine, "model_name": "m"}
            if engine == "0":
                values = {
                    "vllm:num_requests_running": i % 3, "vllm:num_requests_waiting": i // 10,
                    "vllm:kv_cache_usage_perc": 0.1 * (i % 10), "vllm:num_preemptions_total": i // 5,
                    "vllm:generation_tokens_total": 100 * i, "vllm:prompt_tokens_total": 300 * i,
                    "vllm:prefix_cache_queries_total": 10 * i, "vllm:prefix_cache_hits_total": 4 * i,
                    "vllm:spec_decode_num_drafts_total": 5 * i, "vllm:spec_decode_num_draft_tokens_total": 15 * i,
                    "vllm:spec_decode_num_accepted_tokens_total": 9 * i,
                }
            else:
                # engine 1 restarts at i = 30: its counters start again from 0
                j = i if i < 30 else i - 30
                values = {
                    "vllm:num_requests_running": 1, "vllm:num_requests_waiting": 0,
                    "vllm:kv_cache_usage_perc": 0.5, "vllm:num_preemptions_total": j // 2,
                    "vllm:generation_tokens_total": 50 * j, "vllm:prompt_tokens_total": 100 * j,
                    "vllm:prefix_cache_queries_total": 10 * j, "vllm:prefix_cache_hits_total": 1 * j,
                }
            for name, value in values.items():
                metrics.append(dict(run_id=r, t_unix=t, name=name, labels=labels, value=float(value)))
            # An unrelated series and a histogram bucket that the views must ignore.
            metrics.append(dict(run_id=r, t_unix=t, name="vllm:request_success_total", labels=labels, value=float(i)))
            metrics.append(dict(run_id=r, t_unix=t, name="vllm:e2e_request_latency_seconds_bucket",
                                labels={**labels, "le": "1.0"}, value=float(i)))
    # An earlier scrape in second 3 (T0+3.2): the later one at T0+3.5 must win within the second.
    for name, value in {"vllm:num_requests_running": 99.0, "vllm:num_preemptions_total": 50.0}.items():
        metrics.append(dict(run_id=r, t_unix=T0 + 3.2, name=name, labels={"engine": "0", "model_name": "m"}, value=value))
    health = []
    for i in range(60):
        for w, cpu in (("w1", 20.0 + i), ("w2", 50.0)):
            health.append(dict(run_id=r, worker=w, t_unix=T0 + 0.3 + i, cpu_percent=cpu, loop_lag_ms=float(i % 7),
                               loop_lag_p99_ms=1.0, in_flight=2, backlog=0, rss_mb=100.0))
    return dict(runs=runs, run_classes=classes, stages=stages, requests=reqs, run_workers=workers,
                server_metrics=metrics, client_health=health)


def k2_rows() -> dict[str, list[dict]]:
    r = "k2-open"
    runs = [dict(run_id=r, started_unix=T1, finished_unix=T1 + 45, profile_name="rate-sweep", load_kind="rate",
                 target="http://127.0.0.1:8000", variant="gptq", hardware="h200", model="m", gpus=1,
                 status="completed", flags=[], tags={})]
    classes = [dict(run_id=r, class_name="chat", weight=1.0, slo_ttft_ms=300.0, slo_tpot_ms=None,
                    slo_itl_ms=None, slo_e2e_ms=2000.0)]
    stages, reqs = [], []
    start = T1
    # Stage 0 (1 req/s): 10 requests, TTFT 100..190, all meet their SLOs.
    # Stage 1 (2 req/s): 20 requests with TTFT 150; two take 2500 ms end to end: attainment 90%.
    # Stage 2 (4 req/s): 40 requests; 20 with TTFT 600: attainment 50%, p99 TTFT 600.
    #   => highest level meeting 90% = 2; first failing = 4; knee (p99 TTFT > 300) = 4,
    #      interpolated 2 + (300 - 150) * (4 - 2) / (600 - 150) = 2.667.
    # One dropped arrival in stage 2 (never sent) and one late send (300 ms lag) in stage 1.
    for stage, rate, n in ((0, 1.0, 10), (1, 2.0, 20), (2, 4.0, 40)):
        stages.append(dict(run_id=r, stage=stage, kind="rate", level=rate, started_unix=start, reached_unix=start,
                           measure_start_unix=start + 2, measure_end_unix=start + 12, ended_unix=start + 15))
        for i in range(n):
            scheduled = start + 2 + (i + 0.5) / rate
            lag_ms = 300.0 if (stage == 1 and i == 3) else 1.0 + (i % 3)
            sent = scheduled + lag_ms / 1000
            if stage == 0:
                ttft, e2e = 100 + 10 * i, 600
            elif stage == 1:
                ttft, e2e = 150, (2500 if i in (4, 9) else 700)
            else:
                ttft, e2e = (600 if i % 2 else 150), 900
            offsets = [ttft, ttft + (e2e - ttft) / 2, e2e]
            reqs.append(request(r, f"s{stage}-{i}", "chat", stage, rate, sent, offsets, scheduled=scheduled,
                                arrival_status="late" if lag_ms > 100 else "on_time", seq=i))
        if stage == 2:
            reqs.append(request(r, "s2-dropped", "chat", 2, rate, None, scheduled=start + 5.01,
                                arrival_status="dropped", error="dropped"))
        # A warm-up arrival before the window.
        reqs.append(request(r, f"s{stage}-warm", "chat", stage, rate, start + 1, [100, 200], scheduled=start + 0.999,
                            warmup=True, arrival_status="on_time"))
        start += 15
    metrics = []
    for i in range(45):
        labels = {"engine": "0", "model_name": "m"}
        for name, value in (("vllm_num_requests_running", float(i % 4)), ("vllm_num_requests_waiting", 0.0),
                            ("vllm_kv_cache_usage_perc", 0.02 * i), ("vllm_num_preemptions_total", float(i // 10))):
            metrics.append(dict(run_id=r, t_unix=T1 + 0.25 + i, name=name, labels=labels, value=value))
    return dict(runs=runs, run_classes=classes, stages=stages, requests=reqs, run_workers=[],
                server_metrics=metrics, client_health=[])


def create_db(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    con.execute(SCHEMA.read_text())
    return con


def results_db(path: Path, data: dict[str, list[dict]]) -> duckdb.DuckDBPyConnection:
    """A results file holding ``data``, with the views installed the way a writer installs them
    (which also fills in what rows inserted without the Store lack); the caller closes it."""
    from servelab.analysis.views import install_views

    con = create_db(path)
    insert(con, data)
    install_views(con)
    return con


def read_only_rows(path: Path, sql: str) -> list[tuple]:
    """``sql``'s rows as a reader that cannot write sees them: the file opened read-only, the views
    installed as TEMP ones for that connection only."""
    from servelab.analysis.views import install_views

    reader = duckdb.connect(str(path), read_only=True)
    try:
        install_views(reader, temporary=True)
        return reader.execute(sql).fetchall()
    finally:
        reader.close()


def insert(con: duckdb.DuckDBPyConnection, data: dict[str, list[dict]]) -> None:
    """Append rows through NDJSON and DuckDB's JSON reader, typed from the table itself
    (executemany costs about a millisecond per row)."""
    import json
    import tempfile

    for table, rows in data.items():
        if not rows:
            continue
        types = dict(con.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
            "AND table_schema = 'main'", [table]).fetchall())
        columns = REQUEST_COLUMNS if table == "requests" else list(rows[0])
        with tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False) as f:
            for row in rows:
                f.write(json.dumps({c: row.get(c) for c in columns}) + "\n")
        spec = "{" + ", ".join(f"'{c}': '{types[c]}'" for c in columns) + "}"
        try:
            con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} "
                        f"FROM read_json('{f.name}', format = 'newline_delimited', columns = {spec})")
        finally:
            Path(f.name).unlink()


def merge(*datasets: dict[str, list[dict]]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in datasets:
        for table, rows in d.items():
            out.setdefault(table, []).extend(rows)
    return out
