"""The row contract (store/rows.py) is the schema: same tables, same columns, same order, and a
row of each type goes into a real DuckDB file by name."""
from __future__ import annotations

import dataclasses

import orjson

from servelab.store.db import TABLES, Store, column_types, open_db
from servelab.store.rows import TABLE_ROWS, RequestRow, dropped_arrival


def test_every_written_table_has_one_row_type_with_the_schema_columns(tmp_path):
    con = open_db(tmp_path / "r.duckdb")
    try:
        assert set(TABLE_ROWS) == set(TABLES)
        for table, row_type in TABLE_ROWS.items():
            fields = [f.name for f in dataclasses.fields(row_type)]
            assert fields == list(column_types(con, table)), table
    finally:
        con.close()


def test_rows_round_trip_through_duckdb(tmp_path):
    class Planned:
        class_name, prompt_tokens, output_tokens, prefix_group, session_id, turn = \
            "chat", 100, 20, 3, 7, 2

    con = open_db(tmp_path / "r.duckdb")
    store = Store(con)
    try:
        sent = RequestRow(run_id="r1", request_id="a", worker="w", worker_seq=1,
                          chunk_offsets_ms=[1.5, 2.5], chunk_tokens=[1, 2]).plan(Planned, 0, 4.0)
        dropped = dropped_arrival("r1", "b", "w", 2, Planned, 0, 4.0, False, 10.0, 11.0, "held")
        store.append_rows("requests", [sent, dropped])
        got = con.execute("SELECT request_id, class_name, session_id, turn, chunk_tokens, "
                          "error_kind, arrival_status FROM requests ORDER BY worker_seq").fetchall()
        assert got == [("a", "chat", "7", 2, [1, 2], None, None),
                       ("b", "chat", "7", 2, [], "dropped", "dropped")]
        assert orjson.loads(orjson.dumps(sent))["prefix_group"] == 3
    finally:
        store.close()
