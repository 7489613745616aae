"""The master's writer under injected failures: every Nth write fails, before, inside or after its
transaction, with several exception types, and a scrape the Prometheus parser refuses comes with
every write. Workers resend what was not acknowledged (as ``worker.recorder`` does); in the end
every request row is in the real DuckDB file exactly once, and each failed source is counted."""
from __future__ import annotations

import duckdb
import gevent
import orjson
import pytest
from gevent.threadpool import ThreadPool

from servelab.loadgen.master.accounts import WorkerAccounts
from servelab.loadgen.master.writer import DbWriter
from servelab.store.db import open_db
from servelab.store.rows import HealthRow, RequestRow

RUN = "faults"
ERRORS = (ValueError("injected"), RuntimeError("injected"), KeyError("injected"),
          duckdb.IOException("injected"), OSError(5, "injected"), MemoryError())


class Faulty:
    """The store's connection with failures: every ``every``-th COMMIT (``where`` = "after": the
    commit happens, then the error), or every ``every``-th table append ("inside"), or every
    ``every``-th write's first statement ("before")."""

    def __init__(self, con, store, where: str, every: int):
        self.con, self.where, self.every = con, where, every
        self.n = {"commit": 0, "append": 0, "begin": 0}
        self.failed = 0
        append = store.append_ndjson

        def faulty_append(table, data, **kw):
            if self.where == "inside" and data and self._due("append"):
                raise self._error()
            return append(table, data, **kw)

        store.append_ndjson = faulty_append

    def _due(self, what: str) -> bool:
        self.n[what] += 1
        return self.n[what] % self.every == 0

    def _error(self) -> BaseException:
        self.failed += 1
        return ERRORS[self.failed % len(ERRORS)]

    def execute(self, sql, *args):
        head = sql.strip().upper()
        if self.where == "before" and head.startswith("BEGIN") and self._due("begin"):
            raise self._error()
        out = self.con.execute(sql, *args)
        if self.where == "after" and head.startswith("COMMIT") and self._due("commit"):
            raise self._error()
        return out

    def __getattr__(self, name):
        return getattr(self.con, name)


def _batch(no: int, first_seq: int, n: int) -> dict:
    rows = b"".join(orjson.dumps(RequestRow(RUN, f"r{s}", "w0", s, ttft_ms=1.0)) + b"\n"
                    for s in range(first_seq, first_seq + n))
    health = orjson.dumps(HealthRow(RUN, "w0", float(no), cpu_percent=1.0)) + b"\n"
    return {"run_id": RUN, "worker": "w0", "batch": no, "rows": rows, "n_rows": n,
            "health": health}


@pytest.mark.parametrize("where,every", [("before", 3), ("inside", 4), ("after", 2),
                                         ("after", 1)])
def test_every_row_stored_exactly_once_whatever_fails(tmp_path, where, every):
    pool = ThreadPool(1)
    acked: set[int] = set()
    accounts = WorkerAccounts(["local"])
    db = str(tmp_path / "r.duckdb")
    writer = DbWriter(pool, open_db, db, RUN, accounts, lambda node, w, no: acked.add(no))
    faulty = Faulty(writer.store.con, writer.store, where, every)
    writer.store.con = faulty
    scrape_errors = []
    writer.on_scrape_error = lambda t, exc: scrape_errors.append(exc)
    batches = {no: _batch(no, 10 * no, 10) for no in range(1, 41)}
    try:
        for no, data in batches.items():
            writer.batch("local", data)
            if no % 5 == 0:
                writer.metrics(float(no), "{}")   # not Prometheus text: the parser refuses it
                writer.metrics(float(no), "# TYPE x counter\nx_total 3\n")
                writer.call(lambda store: store.append_rows("stages", []))
                writer.wait_idle(10)
        for _ in range(20):   # the workers' resends of what was not acknowledged
            writer.wait_idle(10)
            missing = [no for no in batches if no not in acked]
            if not missing:
                break
            for no in missing:
                writer.batch("local", batches[no])
            gevent.sleep(0)
        writer.wait_idle(10)
        assert not [no for no in batches if no not in acked]
        con = writer.store.con.con
        got = con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone()
        assert got == (400, 400)
        health = con.execute("SELECT count(*), count(DISTINCT t_unix) FROM client_health")
        assert health.fetchone() == (40, 40)
        marks = con.execute("SELECT count(DISTINCT batch), count(batch) FROM stored_batches "
                            "WHERE worker IS NOT NULL").fetchone()
        assert marks == (40, 40)
        assert accounts.get("w0").stored == 400
        assert faulty.failed > 0, "the injection never fired"
        assert writer.source_errors["scrape"][0] == 8 and len(scrape_errors) == 8
        # the good scrape of each pair is stored even when the bad one failed beside it, unless
        # an injected failure hit its own write (counted)
        lost = writer.source_errors.get("metrics", (0, ""))[0]
        assert con.execute("SELECT count(*) FROM server_metrics WHERE name = 'x_total'"
                           ).fetchone()[0] == 8 - lost
    finally:
        writer.close()
        pool.kill()


def test_a_scrape_the_parser_refuses_fails_only_itself(tmp_path):
    pool = ThreadPool(1)
    acked: set[int] = set()
    accounts = WorkerAccounts(["local"])
    writer = DbWriter(pool, open_db, str(tmp_path / "r.duckdb"), RUN, accounts,
                      lambda node, w, no: acked.add(no))
    try:
        writer.batch("local", _batch(1, 0, 5))
        writer.metrics(1.0, "<html><body>Sign in</body></html>")
        writer.batch("local", _batch(2, 5, 5))
        writer.wait_idle(10)
        assert acked == {1, 2}
        assert writer.store.con.execute("SELECT count(*) FROM requests").fetchone()[0] == 10
        count, last = writer.source_errors["scrape"]
        assert count == 1 and "ValueError" in last and "rows" not in writer.source_errors
    finally:
        writer.close()
        pool.kill()
