"""Rows never poison rows: a value a column refuses costs that value (NULL, with the reason in
data_quality), never the batch; the master's writer stores the rest of a failing transaction
once instead of having it resent forever; ``servelab ingest`` skips and reports what it cannot
load. Real DuckDB files throughout."""
import json
from collections import deque

import duckdb
import orjson
import pytest

from servelab.loadgen.master.writer import DbWriter
from servelab.store.db import Store, open_db
from servelab.store.ingest import ingest
from servelab.store.rows import RequestRow

POISON = [
    ("output_tokens", 3000000000),
    ("output_tokens", 1e23),
    ("prompt_tokens", "many"),
    ("cached_tokens", "lots"),
    ("worker_seq", 2**70),
    ("chunk_tokens", [1, 2**40]),
    ("ttft_ms", "fast"),
    ("warmup", "maybe"),
]


def good(seq: int) -> bytes:
    return orjson.dumps(RequestRow(run_id="r", request_id=f"q{seq}", worker="w", worker_seq=seq,
                                   output_tokens=5, chunk_tokens=[1, 4]))


def poisoned(seq: int, field: str, value) -> bytes:
    row = orjson.loads(good(seq))
    row[field] = value
    return json.dumps(row).encode()   # the standard encoder writes ints of any width


def rows(con):
    return con.execute("SELECT worker_seq, output_tokens, prompt_tokens, data_quality "
                       "FROM requests ORDER BY request_id").fetchall()


@pytest.mark.parametrize("field,value", POISON)
def test_a_failing_batch_keeps_its_good_rows_and_the_bad_rows_reason(tmp_path, field, value):
    store = Store(open_db(tmp_path / "r.duckdb"))
    try:
        lines = [good(i) for i in range(40)]
        lines[17] = poisoned(17, field, value)
        data = b"\n".join(lines) + b"\n"
        with pytest.raises(duckdb.Error):
            store.append_ndjson("requests", data)   # as is, the batch fails
        store.append_ndjson("requests", data, checked=True)
        got = store.con.execute("SELECT request_id, data_quality, worker_seq FROM requests"
                                ).fetchall()
        assert len(got) == 40 and store.repaired == 1 and store.dropped == 0
        bad = [g for g in got if g[0] == "q17"][0]
        assert bad[1].startswith("quarantined: ") and field in bad[1], bad
        assert all(g[1] is None for g in got if g[0] != "q17")
    finally:
        store.close()


def test_a_line_that_is_no_row_is_dropped_and_counted(tmp_path):
    store = Store(open_db(tmp_path / "r.duckdb"))
    try:
        data = b"\n".join([good(1), b"[1, 2, 3]", good(2)]) + b"\n"
        store.append_ndjson("requests", data, checked=True)
        assert [r[0] for r in rows(store.con)] == [1, 2]
        assert (store.repaired, store.dropped) == (0, 1)
    finally:
        store.close()


def test_no_batch_file_outlives_its_write(tmp_path, monkeypatch):
    """Every write's file is gone once it is read, whether the write stored, failed or was
    checked, and a store nobody closed (a killed process's) leaves nothing of its rows behind."""
    import tempfile
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    store = Store(open_db(tmp_path / "r.duckdb"))
    lines = [good(i) for i in range(10)]
    lines[3] = poisoned(3, "ttft_ms", "fast")
    data = b"\n".join(lines) + b"\n"
    with pytest.raises(duckdb.Error):
        store.append_ndjson("requests", data)
    store.append_ndjson("requests", data, checked=True)
    store.append_rows("requests", [RequestRow(run_id="r", request_id="q99", worker="w",
                                              worker_seq=99)])
    assert store.con.execute("SELECT count(*) FROM requests").fetchone()[0] == 11
    assert list(spill.iterdir()) == []   # before any close
    store.close()


class _Account:
    def __init__(self, worker):
        self.worker, self.stored, self.batches, self.stored_batches = worker, 0, 0, set()


def test_the_writer_stores_a_poisoned_transaction_once_and_acknowledges_it(tmp_path):
    """Two workers' batches share one transaction; one holds a poison row. Both are stored and
    acknowledged on the first write, so no worker resends (the loop that lost 529 rows)."""
    writer = DbWriter.__new__(DbWriter)   # its database thread's work, without the event loop
    writer.store = Store(open_db(tmp_path / "r.duckdb"))
    writer.run_id = "r"
    writer.accounts = {"w": _Account("w"), "v": _Account("v")}
    writer._write_no, writer.source_errors, writer.on_scrape_error = 0, {}, None
    writer.marks = deque()
    try:
        clean = b"".join(good(i) + b"\n" for i in range(10))
        dirty = b"".join((poisoned(i, "output_tokens", 3000000000) if i == 13 else good(i))
                         .replace(b'"w"', b'"v"') + b"\n" for i in range(10, 20))
        items = [("batch", "n1", {"worker": "w", "batch": 1, "rows": clean, "health": b"",
                                  "n_rows": 10}),
                 ("batch", "n2", {"worker": "v", "batch": 1, "rows": dirty, "health": b"",
                                  "n_rows": 10})]
        acks = writer._write(items)
        assert [(a[0], a[2], a[4]) for a in acks] == [("n1", 1, True), ("n2", 1, True)]
        got = rows(writer.store.con)
        assert len(got) == 20 and writer.store.repaired == 1
        bad = [g for g in got if g[3]]
        assert len(bad) == 1 and bad[0][:2] == (13, None) and "output_tokens" in bad[0][3]
        # the same batches again (a resend after a lost ack): acknowledged, not stored twice
        acks = writer._write(items)
        assert [a[4] for a in acks] == [False, False] and len(rows(writer.store.con)) == 20
    finally:
        writer.store.close()


def test_ingest_skips_and_reports_bad_lines(tmp_path):
    spool = tmp_path / "spool" / "r" / "w"
    spool.mkdir(parents=True)
    (spool / "meta.json").write_text(json.dumps({"run_id": "r", "worker": "w", "host": "h"}))
    lines = [good(0), poisoned(1, "output_tokens", 3000000000), b"not json at all", good(2),
             poisoned(3, "cached_tokens", "lots"), b'{"no_seq": true}', good(4)[:30]]
    (spool / "requests.ndjson").write_bytes(b"\n".join(lines))
    (spool / "started.bin").write_bytes(b"".join(i.to_bytes(8, "little") for i in range(6)))
    [report] = ingest(tmp_path / "r.duckdb", [spool])
    assert (report.added, report.repaired, report.rejected) == (4, 2, 0)
    assert report.torn == 3 and report.in_flight_lost == 2   # 4 (torn) and 5: no row
    con = open_db(tmp_path / "r.duckdb")
    try:
        got = rows(con)
        assert [g[0] for g in got] == [0, 1, 2, 3]
        assert got[1][1] is None and "output_tokens=3000000000" in got[1][3]
        assert "cached_tokens='lots'" in got[3][3] or "cached_tokens=lots" in got[3][3]
    finally:
        con.close()
    # ingesting it again adds nothing and still does not fail
    [again] = ingest(tmp_path / "r.duckdb", [spool])
    assert again.added == 0


def test_a_run_with_repaired_values_is_flagged_bad_values(tmp_path):
    from servelab.store import runs
    from servelab.store.db import Store, open_db
    from servelab.store.rows import RequestRow, RunRow

    store = Store(open_db(tmp_path / "f.duckdb"))
    try:
        store.append_rows("runs", [RunRow("r1", flags=["predicted"]), RunRow("r2")])
        store.append_rows("requests", [
            RequestRow(run_id="r1", request_id="a", worker="w", worker_seq=1,
                       error_kind="bad_usage",
                       data_quality="bad_usage: completion_tokens=3000000000 out of range"),
            RequestRow(run_id="r2", request_id="b", worker="w", worker_seq=1)])
        assert runs.refresh_flags(store.con, "r1") == ["predicted", "bad_values"]
        assert runs.refresh_flags(store.con, "r2") == []
    finally:
        store.close()


def test_a_run_that_recorded_nothing_is_flagged_and_fails_by_default(tmp_path):
    """A run whose only worker refused it (its notes say why) ends with no rows: flagged
    no_requests, and `servelab run` exits 4 for it unless --fail-on drops the flag."""
    from types import SimpleNamespace

    from servelab.commands.run import DEFAULT_FAIL_ON, EXIT_FLAGGED, EXIT_OK, exit_code
    from servelab.store import runs
    from servelab.store.rows import RunRow

    store = Store(open_db(tmp_path / "f.duckdb"))
    try:
        store.append_rows("runs", [RunRow("empty", status="completed",
                                          notes="a worker could not join the run: OSError: ...")])
        flags = runs.finish(store.con, "empty")
    finally:
        store.close()
    assert flags == ["no_requests"]
    result = SimpleNamespace(status="completed", interrupted=False, error_rate=None, flags=flags)
    assert exit_code(result, 0.5, list(DEFAULT_FAIL_ON)) == EXIT_FLAGGED
    assert exit_code(result, 0.5, ["rows_lost"]) == EXIT_OK
