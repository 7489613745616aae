"""The per-request chunk scalars (requests.chunk_count .. last_chunk_ms, store.db.REQUEST_SCALARS)
give the figures the chunk lists give, however the rows got in (the Store's batch, a plain insert
filled in place, a read-only reader of an old file), and stage_summary's throughput stays the sum
over chunk_arrivals while a live run's windows are set and cut short after its rows exist."""
import duckdb
import orjson
import pytest

from analysis_rows import create_db, insert, read_only_rows, request
from servelab.analysis.views import backfill_sketches, install_views
from servelab.store.db import REQUEST_SCALARS, Store, open_db

T = 1_720_000_000.0
RUN = "sc"


def _rows() -> dict:
    """Every shape the scalars must get right; window [T+10, T+20), so some requests straddle."""
    def req(i, sent, offsets=None, tokens=None, output=None, cls="chat", **kw):
        return request(RUN, f"q{i:02d}", cls, 0, 4.0, sent, offsets, tokens, output, seq=i, **kw)

    reqs = [
        req(0, T + 12, [50, 60, 75, 90]),                                     # inside, 1 token/chunk
        req(1, T + 9.9, [50, 100, 150, 200, 250]),                            # straddles the start
        req(2, T + 19.8, [100, 200, 300, 400, 500]),                          # straddles the end
        req(3, T + 9.5, [100, 20000]),                                        # spans the whole window
        req(4, T + 13, [40, 60, 100, 130], [1, 3, 2, 4]),                     # spec decode
        req(5, T + 19.9, [40, 90, 160], [2, 5, 1], output=9),                 # spec decode, usage != sum, straddles
        req(6, T + 14, [30, 45, 46, 80]),                                     # no usage, no counts
        req(7, T + 15, [20, 30, 31, 70], [None, 2, None, 0], output=5),       # NULL and zero counts
        req(8, T + 15.5, [20, 35, 50, 51, 90], [3, -1, 2], output=8),         # fewer counts than chunks
        req(9, T + 16, [25]),                                                 # one chunk: no gap
        req(10, T + 16.5, [30, 50, 80], error="stream_cut"),                  # failed after chunks
        req(11, T + 17, None, error="http_500"),                              # failed, no chunks
        req(12, None, None, scheduled=T + 17.5, arrival_status="dropped"),    # never sent
        req(13, T + 8, [30, 60, 90], warmup=True),                            # warm-up
        req(14, T + 18, [10, 10, 10, 40], cls="batch"),                       # zero gaps, class without ITL SLO
        req(15, T + 19.95, [10, 20, 30, 45, 50, 200]),                        # straddles, stall per token
    ]
    reqs[6]["chunk_tokens"] = reqs[6]["output_tokens"] = None
    runs = [dict(run_id=RUN, started_unix=T, finished_unix=T + 30, profile_name="scalars",
                 load_kind="concurrency", target="http://127.0.0.1:8000", variant="v", gpus=1,
                 status="completed", flags=[])]
    classes = [dict(run_id=RUN, class_name="chat", weight=0.5, slo_ttft_ms=500.0, slo_tpot_ms=30.0,
                    slo_itl_ms=30.0, slo_e2e_ms=20000.0),
               dict(run_id=RUN, class_name="batch", weight=0.5)]
    stages = [dict(run_id=RUN, stage=0, kind="concurrency", level=4.0, started_unix=T, reached_unix=T,
                   measure_start_unix=T + 10, measure_end_unix=T + 20, ended_unix=T + 30)]
    return dict(runs=runs, run_classes=classes, stages=stages, requests=reqs)


# The definitions as they were computed from the chunk lists at query time, before the scalars.
LISTS = """
WITH b AS (
    SELECT run_id, request_id, coalesce(len(chunk_offsets_ms), 0) AS n,
           list_transform(range(1, coalesce(len(chunk_offsets_ms), 0) + 1),
                          lambda i: greatest(coalesce(chunk_tokens[i], 1), 1)) AS w,
           list_transform(list_zip(list_slice(chunk_offsets_ms, 2, -1), list_slice(chunk_offsets_ms, 1, -2)),
                          lambda p: p[1] - p[2]) AS g,
           sent_unix + chunk_offsets_ms[1] / 1000.0 AS first_unix,
           sent_unix + chunk_offsets_ms[coalesce(len(chunk_offsets_ms), 0)] / 1000.0 AS last_unix
    FROM requests)
SELECT run_id, request_id, n, list_sum(w), list_sum(w) / nullif(n, 0), list_avg(g),
       list_sum(g) / nullif(list_sum(list_slice(w, 2, -1)), 0),
       list_max(list_transform(list_zip(g, list_slice(w, 2, -1)), lambda p: p[1] / p[2])), first_unix, last_unix
FROM b ORDER BY request_id"""
VIEW = ("SELECT run_id, request_id, n_chunks, chunk_tokens_total, tokens_per_chunk, itl_chunk_mean_ms, "
        "itl_mean_ms, itl_max_ms, first_chunk_unix, last_chunk_unix FROM request_metrics ORDER BY request_id")
# Throughput as chunk_arrivals (one row per chunk, the raw truth) counts it.
ARRIVALS = """
SELECT w.stage, coalesce(a.class_name, '(none)'), sum(a.usage_tokens)
FROM stages w JOIN chunk_arrivals a ON a.run_id = w.run_id
 AND a.arrival_unix >= w.measure_start_unix AND a.arrival_unix < w.measure_end_unix
GROUP BY ALL
UNION ALL
SELECT w.stage, '(all)', sum(a.usage_tokens)
FROM stages w JOIN chunk_arrivals a ON a.run_id = w.run_id
 AND a.arrival_unix >= w.measure_start_unix AND a.arrival_unix < w.measure_end_unix
GROUP BY ALL"""


def _ndjson(rows) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def _window_tokens(con) -> dict:
    return {(s, c): t for s, c, t in con.execute(
        "SELECT stage, class_name, output_tokens_in_window FROM stage_summary WHERE output_tokens_in_window > 0"
    ).fetchall()}


def _assert_throughput(con):
    want = {(s, c): t for s, c, t in con.execute(ARRIVALS).fetchall()}
    got = _window_tokens(con)
    assert set(got) == set(want)
    for key, tokens in want.items():
        assert got[key] == pytest.approx(tokens, rel=1e-12, abs=1e-9), key


@pytest.fixture()
def written(tmp_path):
    """The same rows through the Store's batch (scalars computed from the batch file) and through
    a plain insert (scalars filled in place by install_views)."""
    data = _rows()
    store = Store(open_db(tmp_path / "store.duckdb"))
    for table in ("runs", "run_classes", "stages"):
        store.append_ndjson(table, _ndjson(data[table]))
    for half in (data["requests"][:7], data["requests"][7:]):   # batch by batch, as a run writes
        store.append_ndjson("requests", _ndjson(half))
    install_views(store.con)
    plain = create_db(tmp_path / "plain.duckdb")
    insert(plain, data)
    assert plain.execute("SELECT count(*) FROM requests WHERE chunk_count IS NULL").fetchone()[0] == len(data["requests"])
    install_views(plain)
    yield store.con, plain
    store.close()
    plain.close()


def test_scalars_equal_the_chunk_lists(written):
    for con in written:
        assert con.execute(VIEW).fetchall() == con.execute(LISTS).fetchall()
        assert con.execute("SELECT count(*) FROM requests WHERE chunk_count IS NULL").fetchone()[0] == 0
    store, plain = written
    cols = ", ".join(REQUEST_SCALARS)
    assert (store.execute(f"SELECT request_id, {cols} FROM requests ORDER BY request_id").fetchall()
            == plain.execute(f"SELECT request_id, {cols} FROM requests ORDER BY request_id").fetchall())
    slo = ("SELECT request_id, itl_slo_met, slo_met FROM request_metrics ORDER BY request_id")
    assert store.execute(slo).fetchall() == plain.execute(slo).fetchall()
    met = dict(store.execute("SELECT request_id, itl_slo_met FROM request_metrics").fetchall())
    assert met["q15"] is False and met["q00"] is True   # 150 ms over one token; 15 ms per token


def test_stage_summary_same_however_written(written):
    store, plain = written
    query = "SELECT * FROM stage_summary ORDER BY run_id, stage, class_name"
    assert store.execute(query).fetchall() == plain.execute(query).fetchall()
    for con in written:
        _assert_throughput(con)
    spans = dict(store.execute(
        "SELECT request_id, first_chunk_unix < 1720000010 OR last_chunk_unix >= 1720000020 "
        "FROM request_metrics WHERE n_chunks > 0 AND last_chunk_unix >= 1720000010 "
        "AND first_chunk_unix < 1720000020").fetchall())
    assert {k for k, v in spans.items() if v} == {"q01", "q02", "q03", "q05", "q15"}


def test_live_windows_set_after_rows_and_cut_short(tmp_path):
    """As the master writes: rows batch by batch, the stage row (window) after them, then Stop
    cuts the window short; every figure follows, none was frozen at write time."""
    data = _rows()
    store = Store(open_db(tmp_path / "live.duckdb"))
    install_views(store.con)
    con = store.con
    store.append_ndjson("runs", _ndjson(data["runs"]))
    store.append_ndjson("run_classes", _ndjson(data["run_classes"]))
    store.append_ndjson("requests", _ndjson(data["requests"][:5]))
    assert con.execute("SELECT count(*) FROM stage_summary").fetchone()[0] == 0   # no stage yet
    store.append_ndjson("stages", _ndjson(data["stages"]))
    _assert_throughput(con)
    store.append_ndjson("requests", _ndjson(data["requests"][5:]))
    _assert_throughput(con)
    before = _window_tokens(con)[(0, "(all)")]
    con.execute("UPDATE stages SET measure_end_unix = ? WHERE run_id = ?", [T + 16.0, RUN])   # Stop
    _assert_throughput(con)
    after = con.execute("SELECT output_tokens_in_window, requests, window_s FROM stage_summary "
                        "WHERE class_name = '(all)'").fetchone()
    assert after[0] < before and after[2] == 6.0
    assert after[1] == con.execute("SELECT count(*) FROM request_metrics WHERE measured AND NOT dropped").fetchone()[0]
    store.close()


def test_read_only_reader_of_a_file_without_scalars(tmp_path):
    """A file from before the scalar columns and the store's chunk macros, opened read-only
    (another reader holds it for writing): TEMP macros and a TEMP view compute them from the
    lists; a writer's open adds and fills them."""
    from servelab.analysis.views import SCHEMA_MACRO, view_names
    from servelab.store.db import schema_sql

    path = tmp_path / "old.duckdb"
    con = create_db(path)
    for name in REQUEST_SCALARS:
        con.execute(f"ALTER TABLE requests DROP COLUMN {name}")
    insert(con, _rows())
    backfill_sketches(con)   # the version before the scalars wrote its sketches
    for view in view_names():
        con.execute(f"DROP VIEW IF EXISTS {view}")
    macros = [m.group(0).split()[4].split("(")[0] for m in SCHEMA_MACRO.finditer(schema_sql())]
    assert {"servelab_chunk_weight", "servelab_chunk_gaps", "servelab_sketch_bin"} <= set(macros)
    for name in macros:
        con.execute(f"DROP MACRO {name}")
    con.close()
    query = "SELECT * FROM stage_summary ORDER BY ALL"
    temp = read_only_rows(path, query)
    writer = duckdb.connect(str(path))
    install_views(writer)
    assert writer.execute("SELECT count(*) FROM requests WHERE chunk_count IS NULL").fetchone()[0] == 0
    assert writer.execute(query).fetchall() == temp
    writer.close()


def _scans(con, sql) -> list[tuple[list, int]]:
    """(columns read, rows out) of every scan of `requests` in the profiled run of `sql`."""
    out = []

    def walk(node):
        info = node.get("extra_info", {})
        if node.get("operator_name") == "SEQ_SCAN" and str(info.get("Table", "")).endswith(".requests"):
            cols = info.get("Projections", [])
            out.append((cols if isinstance(cols, list) else [cols], node.get("operator_cardinality")))
        for child in node.get("children", []):
            walk(child)

    walk(orjson.loads(con.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}").fetchall()[0][1]))
    return out


def test_summary_reads_the_chunk_lists_of_straddlers_only(tmp_path):
    """The per-request figures read no chunk list at all; stage_summary reads the lists of the
    requests that straddle a window edge, fetched edge by edge, and not those of the rest
    (EXPLAIN ANALYZE: the rows out of the one scan that reads chunk_offsets_ms)."""
    stages, reqs = [], []
    # 3 stages of 100 s, windows [10, 90): 4000 requests each, 1 per 25 ms, 2 s long (DuckDB
    # pushes the join filter into a scan of a table this size; of a few hundred rows it need not)
    for st in range(3):
        t0 = T + 100 * st
        stages.append(dict(run_id=RUN, stage=st, kind="concurrency", level=2.0 ** st, started_unix=t0,
                           reached_unix=t0, measure_start_unix=t0 + 10, measure_end_unix=t0 + 90,
                           ended_unix=t0 + 100))
        for i in range(4000):
            reqs.append(request(RUN, f"s{st}-{i:04d}", "chat", st, 2.0 ** st, t0 + 0.025 * i,
                                [100.0 + 100 * j for j in range(20)], seq=len(reqs)))
    data = _rows()
    store = Store(open_db(tmp_path / "edges.duckdb"))
    store.append_ndjson("runs", _ndjson(data["runs"]))
    store.append_ndjson("run_classes", _ndjson(data["run_classes"]))
    store.append_ndjson("stages", _ndjson(stages))
    for i in range(0, len(reqs), 2000):
        store.append_ndjson("requests", _ndjson(reqs[i:i + 2000]))
    install_views(store.con)
    con = store.con
    scalar_only = _scans(con, "SELECT slo_met, itl_max_ms, tokens_per_chunk, itl_mean_ms, itl_chunk_mean_ms "
                              "FROM request_metrics")
    assert scalar_only and not any("chunk_offsets_ms" in c or "chunk_tokens" in c for c, _ in scalar_only)
    straddlers = con.execute(
        "SELECT count(*) FROM request_metrics r JOIN stages w USING (run_id) WHERE r.first_chunk_unix "
        "< w.measure_end_unix AND r.last_chunk_unix >= w.measure_start_unix AND NOT (r.first_chunk_unix "
        ">= w.measure_start_unix AND r.last_chunk_unix < w.measure_end_unix)").fetchone()[0]
    assert 300 <= straddlers <= 600   # about 80 per edge, of 12,000
    lists = [rows for cols, rows in _scans(con, "SELECT * FROM stage_summary") if "chunk_offsets_ms" in cols]
    # the fetch skips whole vectors (2,048 rows) that hold no straddler of the edge fetched
    assert len(lists) == 1 and straddlers <= lists[0] <= len(reqs) // 4, lists
    _assert_throughput(con)
    store.close()


def test_batch_forms_equal_the_definitions(tmp_path):
    """What the Store's batch path stores, on every token shape (counts all >= 1, more or fewer
    than chunks, NULL, zero, negative, none, no chunks), is what REQUEST_SCALARS and
    ITL_SKETCH_SELECT give from the stored row, value for value: a guard for any faster form of
    the batch's statements."""
    from servelab.store.db import ITL_SKETCH_SELECT
    from servelab.store.rows import RequestRow

    off = [50.0, 61.5, 61.5, 90.25, 130.0]
    shapes = [(off, [1] * 5), (off, [1, 3, 2, 4, 1]), (off, [2, 1, 3, 7, 1, 9]),   # ones, spec, extra
              (off, [1, 1]), (off, [1, None, 2, 1, 1]), (off, [1, 0, 2, 1, 1]),       # fewer, NULL, zero
              (off, [3, -1, 2, 1, 1]), (off, None), (off, []), ([25.0], [4]), ([25.0], None),
              ([], []), (None, None), ([10.0, 5.0, 7.0], [1, 1, 1]),                 # negative gap
              ([0.0, 0.0, 1e-7, 7.5e6], [1, 2, 1, 5])]
    store = Store(open_db(tmp_path / "b.duckdb"))
    rows = [RequestRow(run_id="b", request_id=f"s{i:02d}", worker="w", worker_seq=i,
                       chunk_offsets_ms=o, chunk_tokens=k) for i, (o, k) in enumerate(shapes)]
    store.append_rows("requests", rows)
    con = store.con
    cols = ", ".join(REQUEST_SCALARS)
    exprs = ", ".join(f"{e} AS {n}" for n, e in REQUEST_SCALARS.items())
    assert (con.execute(f"SELECT request_id, {cols} FROM requests ORDER BY request_id").fetchall()
            == con.execute(f"SELECT request_id, {exprs} FROM requests ORDER BY request_id").fetchall())
    stored = con.execute("SELECT * FROM itl_sketches ORDER BY request_id").fetchall()
    assert len(stored) == len(shapes)
    assert stored == con.execute(f"SELECT * FROM ({ITL_SKETCH_SELECT.format(source='requests')}) "
                                 "ORDER BY request_id").fetchall()
    store.close()
