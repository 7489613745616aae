"""Tables of what the server's host says besides its responses: the engine's iterations (read from
its log) and GPU samples (NVML or a DCGM exporter). ``store.db`` applies ``DDL`` with
schema.sql; rows arrive after the run (``orchestration/iterations.py``, ``gpu_telemetry.py``),
when the runner holds the database again, so the master stays its only writer during a run.

Rows enter as NDJSON through DuckDB's JSON reader with the table's own column types, as every
batch of ``store.db`` does: 25,000 iteration lines cost tens of milliseconds, not seconds.
"""
from __future__ import annotations

import os
import tempfile

import orjson

DDL = """
CREATE TABLE IF NOT EXISTS server_iterations (
    run_id              VARCHAR,
    source              VARCHAR,    -- the log file the lines came from
    engine              INTEGER,    -- "Engine NNN": the data-parallel rank (or instance)
    iteration           BIGINT,     -- Iteration(N): the engine's steps with work, from 0
    line_no             INTEGER,    -- line of the log file
    log_second_unix     DOUBLE,     -- the logger's stamp (whole seconds, read in log_utc_offset_s)
    time_unix           DOUBLE,     -- estimated time of the line within its second (see docs)
    time_error_s        DOUBLE,     -- half-width of the interval the estimate lies in
    context_requests    INTEGER,    -- requests in their prompt phase (new or a prefill chunk)
    context_tokens      INTEGER,
    generation_requests INTEGER,
    generation_tokens   INTEGER,
    elapsed_ms          DOUBLE,     -- vLLM: the wait for the model's output after scheduling
    kv_cache_usage_pct  DOUBLE,     -- after the step, 0-100
    dummy               BOOLEAN     -- a data-parallel dummy step
);

CREATE TABLE IF NOT EXISTS gpu_metrics (
    run_id            VARCHAR,
    source            VARCHAR,      -- nvml | dcgm (with the exporter's URL in gpu_sources)
    gpu               INTEGER,      -- index on its host (DCGM: the gpu label)
    uuid              VARCHAR,
    name              VARCHAR,
    t_unix            DOUBLE,
    util_pct          DOUBLE,       -- GPU busy share of the last sample period
    sm_clock_mhz      DOUBLE,
    mem_used_mib      DOUBLE,
    power_w           DOUBLE,
    temp_c            DOUBLE,
    energy_j          DOUBLE        -- the board's energy counter since driver load, or NULL
);
"""
TABLES = ("server_iterations", "gpu_metrics")


def _types(con, table: str) -> dict[str, str]:
    rows = con.execute("SELECT column_name, data_type FROM information_schema.columns "
                       "WHERE table_name = ? AND table_schema = 'main' ORDER BY ordinal_position",
                       [table]).fetchall()
    return dict(rows)


def insert_rows(con, table: str, rows: list[dict]) -> int:
    """Append dict rows (keys = columns; a missing key is NULL); returns how many."""
    if not rows:
        return 0
    types = _types(con, table)
    columns = "{" + ", ".join(f"'{n}': '{t}'" for n, t in types.items()) + "}"
    fd, path = tempfile.mkstemp(prefix=f"servelab-{table}-", suffix=".ndjson")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
        quoted = path.replace("'", "''")
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_json('{quoted}', "
                    f"format = 'newline_delimited', columns = {columns})")
    finally:
        os.remove(path)
    return len(rows)


def replace_rows(con, table: str, run_id: str, source: str, rows: list[dict]) -> int:
    """The run's rows from ``source``, replacing those an earlier ingest of it stored, in one
    transaction (ingesting the same log twice must not count its iterations twice)."""
    con.execute("BEGIN")
    try:
        con.execute(f"DELETE FROM {table} WHERE run_id = ? AND source = ?", [run_id, source])
        n = insert_rows(con, table, rows)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return n


def add_note(con, run_id: str, note: str, prefix: str) -> None:
    """Add ``note`` to the run's notes, replacing an earlier note that starts with ``prefix``
    (a second ingest of the same source restates, it does not repeat)."""
    row = con.execute("SELECT notes FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return
    kept = [n for n in (row[0] or "").split("; ") if n and not n.startswith(prefix)]
    con.execute("UPDATE runs SET notes = ? WHERE run_id = ?", ["; ".join(kept + [note]), run_id])
