"""``servelab ingest-log`` and ``servelab ingest-gpu``: the server's own account, added to a run
after it: the engine's iteration lines of a saved server log (``server_iterations``), and the GPU
samples of ``python -m servelab.orchestration.gpu_telemetry`` (``gpu_metrics``)."""
from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("ingest-log", help="load a server log's iteration lines into a run "
                       "(vLLM's --enable-logging-iteration-details)")
    p.add_argument("--run", required=True, metavar="RUN", help="the run the log belongs to")
    p.add_argument("log", metavar="FILE", help="the server's log (plain or .gz; `docker compose "
                   "logs` output too)")
    p.add_argument("--utc-offset", type=float, metavar="HOURS", help="the log clock's zone "
                   "(default: the quarter-hour offset that places the lines inside the run)")
    p.add_argument("--db", help="DuckDB file (default: $SERVELAB_DB or results/servelab.duckdb)")
    p.set_defaults(func=ingest_log)
    g = sub.add_parser("ingest-gpu", help="load GPU samples (JSON lines of the standalone "
                       "sampler) into a run's gpu_metrics")
    g.add_argument("--run", required=True, metavar="RUN")
    g.add_argument("samples", metavar="FILE")
    g.add_argument("--db", help="DuckDB file (default: $SERVELAB_DB or results/servelab.duckdb)")
    g.set_defaults(func=ingest_gpu)


def _db(args) -> Path:
    from servelab.core.paths import default_db

    return Path(args.db) if args.db else default_db()


def ingest_log(args) -> int:
    from servelab.orchestration.iterations import ingest_iteration_log

    offset = None if args.utc_offset is None else int(round(args.utc_offset * 3600))
    report = ingest_iteration_log(_db(args), args.run, args.log, offset)
    print(report.note() if report.lines else f"{args.log}: no iteration lines (start the server "
          "with --enable-logging-iteration-details)")
    return 0


def ingest_gpu(args) -> int:
    from servelab.core.errors import ServelabError
    from servelab.orchestration.gpu_telemetry import ingest_samples
    from servelab.orchestration.iterations import run_window
    from servelab.store.db import open_db

    if not Path(args.samples).is_file():
        raise ServelabError(f"{args.samples}: no such file")
    con = open_db(_db(args))
    try:
        run_window(con, args.run)   # the run must exist
        n = ingest_samples(con, args.run, Path(args.samples),
                           f"gpu_metrics: samples from {Path(args.samples).name}")
    finally:
        con.close()
    print(f"{n} GPU samples stored for run {args.run}")
    return 0
