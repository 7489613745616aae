"""The sketched ITL percentiles (itl_stage_quantiles, DDSketch at 1%) against the exact ones
(itl_stage_quantiles_exact) on shapes chosen to break a sketch: bimodal stalls, speculative-decoding
bursts of many tokens per chunk, a single huge outlier, all-zero gaps, tiny and huge values; plus
the sketch written with a batch equals the one backfilled into an old file."""
import random

import pytest

from analysis_rows import T0, create_db, insert, k1_rows, read_only_rows, request, results_db
from servelab.analysis.views import backfill_sketches, install_views

BOUND = 0.01 * (1 + 1e-9)  # alpha, and float rounding at a bucket edge


def _offsets(gaps, first=50.0):
    out, t = [first], first
    for g in gaps:
        t += g
        out.append(t)
    return out


def _shapes():
    rng = random.Random(7)
    shapes = {}
    # bimodal: a steady 10 ms pace with 5% preemption stalls of ~2 s
    shapes["bimodal"] = [([rng.uniform(9, 11) if rng.random() > 0.05 else rng.uniform(1800, 2200)
                           for _ in range(120)], None) for _ in range(6)]
    # spec-decode bursts: 1..12 tokens per chunk, the gap growing with the burst
    bursts = []
    for _ in range(6):
        k = [rng.randint(1, 12) for _ in range(80)]
        bursts.append(([kk * rng.uniform(7, 9) for kk in k], [1] + k))
    shapes["spec_burst"] = bursts
    # one huge outlier among thousands of equal gaps
    shapes["outlier"] = [([20.0] * 400 + [1e6] + [20.0] * 99, None)]
    # every gap zero (a server that flushes the whole answer at once)
    shapes["zeros"] = [([0.0] * 50, None) for _ in range(3)]
    # zeros mixed with sub-microsecond and multi-hour values
    shapes["extremes"] = [([0.0, 1e-7, 3e-4, 1.0, 7.5e6] * 30, None) for _ in range(2)]
    return shapes


@pytest.fixture(scope="module")
def shaped_con(tmp_path_factory):
    data = k1_rows()
    data["server_metrics"], data["client_health"] = [], []
    requests = []
    for cls, reqs in _shapes().items():
        for i, (gaps, tokens) in enumerate(reqs):
            requests.append(request("k1-closed", f"{cls}{i}", cls, 1, 4.0, T0 + 36 + 0.01 * i,
                                    _offsets(gaps), tokens))
    data["requests"] = requests
    data["run_classes"] = data["run_classes"] + [
        dict(run_id="k1-closed", class_name=c, weight=0.1) for c in _shapes()]
    # the views' install backfills the sketches: these rows were inserted without the Store
    con = results_db(tmp_path_factory.mktemp("shapes") / "shapes.duckdb", data)
    yield con
    con.close()


COMPARE = """
SELECT s.class_name, s.view, s.samples, e.samples, s.mean_ms, e.mean_ms,
       [s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms], [e.p50_ms, e.p90_ms, e.p95_ms, e.p99_ms], s.method, e.method
FROM itl_stage_quantiles s
JOIN itl_stage_quantiles_exact e USING (run_id, stage, class_name, view)
ORDER BY s.class_name, s.view
"""


def test_sketched_percentiles_within_bound_on_adversarial_shapes(shaped_con):
    rows = shaped_con.execute(COMPARE).fetchall()
    seen = {r[0] for r in rows}
    assert seen == set(_shapes()) | {"(all)"}
    for cls, view, n, n_exact, mean, mean_exact, got, want, method, method_exact in rows:
        where = (cls, view)
        assert (method, method_exact) == ("ddsketch(1%)", "exact")
        assert n == n_exact, where
        assert mean == pytest.approx(mean_exact, rel=1e-12), where
        for g, w in zip(got, want):
            if w == 0:
                assert g == 0, where  # zeros are counted apart, so they come back exactly
            else:
                assert abs(g - w) <= BOUND * abs(w), (where, g, w, abs(g - w) / abs(w))


def test_outlier_and_stalls_are_seen(shaped_con):
    """A sketch must not smooth the tail away: p99 of the bimodal class is a stall, and the
    outlier class's p99 is the pace (1 gap in 500), its maximum the outlier."""
    p99 = dict(shaped_con.execute(
        "SELECT class_name, p99_ms FROM itl_stage_quantiles WHERE view = 'chunk'").fetchall())
    assert p99["bimodal"] > 1700
    assert p99["outlier"] == pytest.approx(20.0, rel=BOUND)
    assert p99["zeros"] == 0


def test_stage_summary_says_how_itl_was_computed(shaped_con):
    methods = {m for (m,) in shaped_con.execute(
        "SELECT DISTINCT itl_quantile_method FROM stage_summary WHERE itl_p50_ms IS NOT NULL").fetchall()}
    assert methods == {"ddsketch(1%)"}


def test_store_sketch_equals_backfill(tmp_path):
    """The writer's sketch (Store, in the batch) and the backfill of an old file are the same."""
    from servelab.store.db import Store, open_db
    from servelab.store.rows import RequestRow

    con = open_db(tmp_path / "w.duckdb")
    store = Store(con)
    rows = [RequestRow(run_id="r", request_id=f"q{i}", worker="w", worker_seq=i,
                       chunk_offsets_ms=_offsets(gaps), chunk_tokens=tokens)
            for i, (gaps, tokens) in enumerate(g for reqs in _shapes().values() for g in reqs)]
    rows.append(RequestRow(run_id="r", request_id="none", worker="w", worker_seq=99))
    store.append_rows("requests", rows)
    written = con.execute("SELECT * FROM itl_sketches ORDER BY request_id").fetchall()
    assert len(written) == len(rows)
    con.execute("DELETE FROM itl_sketches")
    assert backfill_sketches(con) == len(rows)
    assert backfill_sketches(con) == 0  # complete: nothing to do
    assert con.execute("SELECT * FROM itl_sketches ORDER BY request_id").fetchall() == written
    store.close()


def test_old_file_is_backfilled_in_place_or_for_a_read_only_reader(tmp_path, known_data):
    """A file from before itl_sketches: a read-only reader sketches into a TEMP table for its own
    connection; a writer's open adds the table and fills it in place. Same figures either way."""
    import duckdb

    path = tmp_path / "old.duckdb"
    con = create_db(path)
    insert(con, known_data)
    con.execute("DROP TABLE itl_sketches")
    con.close()
    query = "SELECT run_id, stage, class_name, itl_p50_ms, itl_p99_ms FROM stage_summary ORDER BY ALL"
    temp = read_only_rows(path, query)
    writer = duckdb.connect(str(path))
    assert "itl_sketches" not in {r[0] for r in writer.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    install_views(writer)
    assert writer.execute("SELECT count(*) FROM itl_sketches").fetchone()[0] == len(known_data["requests"])
    assert writer.execute(query).fetchall() == temp
    assert any(r[3] is not None for r in temp)
    writer.close()
