#!/usr/bin/env python
"""A real server's run, kept small enough for the repository: what the fidelity and quantization
tables read, and the raw rows behind them, without the per-chunk arrays.

    python bench/capture_export.py RUN.duckdb OUTDIR [--run RUN_ID ...]

For every run (default: all in the file) OUTDIR/<run_id>/ gets the figures as servelab's own
views computed them on the full database (``stage_summary.csv``, ``phase_stage_summary.csv``,
``span_join.csv``, ``gpu_stage_energy.csv``) and the raw rows as Parquet: ``requests.parquet``
(every column but ``chunk_offsets_ms`` / ``chunk_tokens``; the per-request gap statistics stay),
``server_spans.parquet`` (without the raw ``attributes`` JSON; every attribute servelab reads has
its column), ``server_iterations.parquet``, ``gpu_metrics.parquet``, ``runs``, ``stages``,
``run_classes``. The views' figures are exact over the full rows; recomputing throughput from
the Parquet alone is not possible (it counts tokens by chunk arrival inside each window), which
is why the CSVs are kept as computed.
"""
from __future__ import annotations

import argparse
from pathlib import Path

VIEWS = ("stage_summary", "phase_stage_summary", "span_join", "gpu_stage_energy")
DROP = {"requests": ("chunk_offsets_ms", "chunk_tokens"), "server_spans": ("attributes",)}
TABLES = ("requests", "server_spans", "server_iterations", "gpu_metrics", "runs", "stages",
          "run_classes")


def export(db: Path, out: Path, runs: list[str] | None) -> list[Path]:
    from servelab.analysis.views import open_results_db

    con = open_results_db(db)
    try:
        runs = runs or [r[0] for r in con.execute(
            "SELECT run_id FROM runs ORDER BY started_unix").fetchall()]
        written = []
        for run in runs:
            folder = out / run
            folder.mkdir(parents=True, exist_ok=True)
            for view in VIEWS:
                con.execute(f"COPY (SELECT * FROM {view} WHERE run_id = ? ORDER BY ALL) TO "
                            f"'{folder / (view + '.csv')}' (HEADER)", [run])
            for table in TABLES:
                cols = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()
                        if c[0] not in DROP.get(table, ())]
                con.execute(f"COPY (SELECT {', '.join(cols)} FROM {table} WHERE run_id = ?) TO "
                            f"'{folder / (table + '.parquet')}' (FORMAT parquet, "
                            "COMPRESSION zstd)", [run])
            written.append(folder)
        return written
    finally:
        con.close()


def open_export(folder: Path):
    """An in-memory DuckDB whose views ``stage_summary``, ``phase_stage_summary``, ``span_join``,
    ``gpu_stage_energy`` (the CSVs) and tables' names (the Parquet files) read what ``export``
    wrote: ``folder`` is one run's folder or a folder of them."""
    import duckdb

    runs = [folder] if (folder / "runs.parquet").is_file() else sorted(
        p.parent for p in folder.glob("*/runs.parquet"))
    if not runs:
        raise SystemExit(f"{folder}: no exported run (a folder with runs.parquet, or of them); "
                         "write one with bench/capture_export.py")
    con = duckdb.connect()
    for name in VIEWS + TABLES:
        kind = "csv" if name in VIEWS else "parquet"
        files = [str(r / f"{name}.{kind}") for r in runs if (r / f"{name}.{kind}").is_file()]
        if not files:
            continue
        reader = (f"read_csv({files!r}, header = true, union_by_name = true)" if kind == "csv"
                  else f"read_parquet({files!r}, union_by_name = true)")
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {reader}")
    return con


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--run", action="append", default=None, help="a run id (repeatable)")
    args = ap.parse_args(argv)
    for folder in export(args.db, args.out, args.run):
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{folder}: {size / 1e3:,.0f} kB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
