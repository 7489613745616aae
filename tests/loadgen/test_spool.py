"""Spool files and `servelab ingest`: exact loss accounting and idempotent recovery."""
import os

import orjson

from loadgen_helpers import query, servelab
from servelab.store.db import Store, open_db
from servelab.store.rows import HealthRow, RequestRow, RunRow, StageRow, WorkerAccount
from servelab.store.spool import Spool, read_spool


def _row(run_id, seq):
    return RequestRow(run_id=run_id, request_id=f"{run_id}-w1-{seq}", worker="w1",
                      worker_seq=seq, class_name="chat", stage=0, level=2.0,
                      sent_unix=1000.0 + seq, ttft_ms=10.0 + seq, e2e_ms=50.0,
                      chunk_offsets_ms=[10.0 + seq, 20.0 + seq], chunk_tokens=[1, 2],
                      output_tokens=3, token_source="usage")


def test_ingest_recovers_a_spool_exactly_once(tmp_path):
    run_id = "run-spool-test"
    db = tmp_path / "t.duckdb"
    store = Store(open_db(db))
    store.append_rows("runs", [RunRow(run_id, status="completed", flags=["rows_lost"])])
    store.append_rows("stages", [StageRow(run_id, 0, "concurrency", 2.0, started_unix=999.0,
                                          measure_start_unix=1002.0, measure_end_unix=1100.0)])
    # the master stored rows 0-2 before the worker died, and counted 3 of 5 produced
    store.append_rows("requests", [_row(run_id, s) for s in range(3)])
    store.append_rows("run_workers", [WorkerAccount(run_id, "w1", produced=3, stored=3,
                                                    in_flight_lost=0, status="lost")])
    store.close()

    spool = Spool(tmp_path / "spool", run_id, "w1")
    for seq in range(7):
        spool.started(seq)          # 7 requests sent ...
    for seq in range(5):
        spool.request(orjson.dumps(_row(run_id, seq)) + b"\n")   # ... 5 finished
    spool.health(orjson.dumps(HealthRow(run_id, "w1", 1001.0, cpu_percent=12.0,
                                        loop_lag_ms=0.4)) + b"\n")
    spool.close()
    with open(spool.dir / "requests.ndjson", "ab") as f:
        f.write(b'{"run_id": "run-spool-test", "worker_seq": 6, "cla')   # torn by the kill

    contents = read_spool(spool.dir)
    assert contents.seqs == set(range(5)) and contents.started == set(range(7))
    assert contents.in_flight_lost == 2 and contents.torn == 1

    res = servelab("ingest", str(tmp_path / "spool" / run_id), "--db", str(db))
    assert res.returncode == 0, res.stderr
    # the console wraps at its width, wherever the (run-dependent) spool path pushes the words
    said = " ".join(res.stdout.split())
    assert "5 rows spooled, 2 added" in said
    assert "2 requests were in flight" in said and "1 torn lines skipped" in said
    assert query(db, "SELECT list(worker_seq ORDER BY worker_seq) FROM requests")[0][0] == \
        [0, 1, 2, 3, 4]
    assert query(db, "SELECT produced, stored, in_flight_lost, status FROM run_workers") == \
        [(5, 5, 2, "recovered")]
    # warm-up recomputed from the stage's window: rows 0 and 1 were sent before it
    assert query(db, "SELECT list(warmup ORDER BY worker_seq) FROM requests")[0][0] == \
        [True, True, False, False, False]
    assert query(db, "SELECT count(*) FROM client_health")[0][0] == 1
    # requests in flight at the kill are still lost: the flag stays
    assert query(db, "SELECT flags FROM runs")[0][0] == ["rows_lost"]

    again = servelab("ingest", str(spool.dir), "--db", str(db))
    assert again.returncode == 0 and "0 added" in again.stdout
    assert query(db, "SELECT count(*) FROM requests")[0][0] == 5
    assert query(db, "SELECT count(*) FROM client_health")[0][0] == 1


def test_ingest_refuses_a_folder_without_spools(tmp_path):
    res = servelab("ingest", str(tmp_path), "--db", str(tmp_path / "t.duckdb"))
    assert res.returncode == 2
    assert "no spool here" in res.stderr


def test_spool_writes_survive_without_close(tmp_path):
    # every write is an os.write on an O_APPEND descriptor: nothing waits in a user-space buffer
    spool = Spool(tmp_path, "r", "w0")
    spool.request(b'{"run_id": "r", "worker_seq": 0}\n')
    spool.started(0)
    size = os.path.getsize(spool.dir / "requests.ndjson")
    assert size == len(b'{"run_id": "r", "worker_seq": 0}\n')
    assert read_spool(spool.dir).seqs == {0}
    spool.close()
