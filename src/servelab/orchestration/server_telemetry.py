"""What the runner adds to a run from the server's side, beside Locust: GPU samples taken while
the run goes (``gpu_telemetry``), and after it the engine's iteration lines from the server's log
(``iterations``) and those samples, loaded once the master has let go of the database.

Nothing here fails a run: a log without iteration lines, or no GPU to sample, is a note.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.orchestration import gpu_telemetry as gt


@dataclass
class Telemetry:
    sampler: gt.GpuSampler | None
    samples_path: Path
    note: str = ""

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.note = self.sampler.note()


def start(spec_text: str | None, target: str | None, starts_simulator: bool, logs: Path,
          interval_s: float = 0.5) -> Telemetry:
    """Start sampling the server's GPUs (``--gpu-telemetry``); a bad spec raises before the run."""
    spec = gt.parse_spec(spec_text)
    path = logs / gt.SAMPLES_FILE
    source, why = gt.open_source(spec, target, starts_simulator)
    if source is None:
        return Telemetry(None, path, why)
    return Telemetry(gt.GpuSampler(source, path, interval_s).start(), path)


def ingest_after_run(db: Path, run_id: str, server_log: str | Path | None,
                     telemetry: Telemetry | None) -> None:
    """Load the server log's iterations and the GPU samples into the run (the runner calls it
    once the master has exited). A failure is reported, the run's rows stay as they are."""
    import duckdb

    from servelab.core.errors import ServelabError
    from servelab.orchestration.iterations import ingest_iteration_text, read_text
    from servelab.store.db import open_db

    text = None
    if server_log is not None and Path(server_log).is_file():
        text = read_text(server_log)
    if text is None and telemetry is None:
        return
    try:
        con = open_db(db)
    except ServelabError as exc:
        print(f"servelab: server telemetry not stored ({exc})", file=sys.stderr)
        return
    try:
        if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is None:
            return   # the run never started; the runner says so
        if text is not None:
            ingest_iteration_text(con, run_id, str(server_log), text)
        if telemetry is not None and (telemetry.sampler is not None or telemetry.note):
            gt.ingest_samples(con, run_id, telemetry.samples_path, telemetry.note)
    except (duckdb.Error, ServelabError, OSError) as exc:
        print(f"servelab: server telemetry not stored ({exc})", file=sys.stderr)
    finally:
        con.close()
