"""The row contract: one dataclass per table row that servelab writes, and nothing else builds
rows by hand. The load generator's workers, the master, ``servelab ingest`` and ``predict`` all
make their rows here; ``tests/test_row_contract.py`` checks every field against ``schema.sql``.

Rows travel as NDJSON (orjson serialises these dataclasses natively) and enter DuckDB by column
name, so a field that is None is a NULL and a field's name is its column's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from servelab.store.spans import SpanRow   # defined beside its OTLP decoder

# error_kind of an open-loop arrival that was never sent (max_in_flight held it back too long).
DROPPED = "dropped"


@dataclass(slots=True)
class RequestRow:
    """``requests``: one per request, whatever its outcome (schema.sql documents each column)."""
    run_id: str | None = None
    request_id: str | None = None
    worker: str | None = None
    worker_seq: int | None = None
    class_name: str | None = None
    stage: int | None = None
    level: float | None = None
    warmup: bool | None = None
    scheduled_unix: float | None = None
    sent_unix: float | None = None
    first_token_unix: float | None = None
    last_token_unix: float | None = None
    done_unix: float | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    chunk_offsets_ms: list = field(default_factory=list)
    chunk_tokens: list = field(default_factory=list)
    prompt_tokens_target: int | None = None
    prompt_tokens: int | None = None
    output_tokens_target: int | None = None
    output_tokens: int | None = None
    token_source: str | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    error_kind: str | None = None
    error_text: str | None = None
    arrival_status: str | None = None
    prefix_group: int | None = None
    session_id: str | None = None
    turn: int | None = None
    response_id: str | None = None
    chunk_token_source: str | None = None
    data_quality: str | None = None

    def plan(self, planned, stage: int, level: float | None) -> "RequestRow":
        """Copy what the planner decided (class, targets, prefix group, session) onto the row."""
        self.class_name = planned.class_name
        self.stage = stage
        self.level = level
        self.prompt_tokens_target = planned.prompt_tokens
        self.output_tokens_target = planned.output_tokens
        self.prefix_group = planned.prefix_group
        self.session_id = None if planned.session_id is None else str(planned.session_id)
        self.turn = planned.turn
        return self


def dropped_arrival(run_id: str, request_id: str, worker: str, worker_seq: int, planned,
                    stage: int, level: float | None, warmup: bool, scheduled_unix: float,
                    done_unix: float, why: str) -> RequestRow:
    """An open-loop arrival that was never sent: a row, so it counts against SLO attainment."""
    return RequestRow(run_id=run_id, request_id=request_id, worker=worker, worker_seq=worker_seq,
                      warmup=warmup, scheduled_unix=scheduled_unix, done_unix=done_unix,
                      error_kind=DROPPED, error_text=why, arrival_status=DROPPED
                      ).plan(planned, stage, level)


@dataclass(slots=True)
class RunRow:
    """``runs``: one per run."""
    run_id: str
    started_unix: float | None = None
    finished_unix: float | None = None
    profile_name: str | None = None
    profile_path: str | None = None
    profile_text: str | None = None
    load_kind: str | None = None
    target: str | None = None
    variant: str | None = None
    hardware: str | None = None
    model: str | None = None
    gpus: int | None = None
    tags: dict = field(default_factory=dict)
    servelab_version: str | None = None
    workers: int | None = None
    status: str | None = None
    host_info: dict | None = None
    flags: list = field(default_factory=list)
    settings: dict | None = None
    verification: dict | None = None
    notes: str | None = None


@dataclass(slots=True)
class ClassRow:
    """``run_classes``: a class's weight and SLOs, copied from the profile."""
    run_id: str
    class_name: str
    weight: float | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_itl_ms: float | None = None
    slo_e2e_ms: float | None = None


def class_rows(run_id: str, profile) -> list[ClassRow]:
    return [ClassRow(run_id, c.name, c.weight, c.slo.ttft_ms, c.slo.tpot_ms, c.slo.itl_ms,
                     c.slo.e2e_ms) for c in profile.classes]


@dataclass(slots=True)
class StageRow:
    """``stages``: one per load stage; the measured window is [measure_start, measure_end)."""
    run_id: str
    stage: int
    kind: str | None = None
    level: float | None = None
    started_unix: float | None = None
    reached_unix: float | None = None
    measure_start_unix: float | None = None
    measure_end_unix: float | None = None
    ended_unix: float | None = None


@dataclass(slots=True)
class WorkerAccount:
    """``run_workers``: produced vs stored rows of one worker (no row is lost silently)."""
    run_id: str
    worker: str
    host: str | None = None
    produced: int | None = None
    stored: int | None = None
    in_flight_lost: int | None = None
    status: str | None = None
    spool_path: str | None = None


@dataclass(slots=True)
class HealthRow:
    """``client_health``: one worker's second."""
    run_id: str
    worker: str
    t_unix: float
    cpu_percent: float | None = None
    loop_lag_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    in_flight: int | None = None
    backlog: int | None = None
    rss_mb: float | None = None
    involuntary_switches_per_s: float | None = None
    host_cpu_percent: float | None = None
    host_steal_percent: float | None = None
    host_load_per_core: float | None = None
    host_runnable_per_core: float | None = None


@dataclass(slots=True)
class MetricSample:
    """``server_metrics``: one Prometheus sample scraped from the target."""
    run_id: str
    t_unix: float
    name: str
    labels: dict
    value: float


@dataclass(slots=True)
class StoredBatch:
    """``stored_batches``: a worker's row batch, committed with its rows (worker None: a write
    that carried no batch, kept so that every write can be looked up)."""
    run_id: str
    worker: str | None
    batch: int | None
    n_rows: int
    write_no: int
    t_unix: float


@dataclass(slots=True)
class EndpointEvent:
    """``endpoint_events``: an endpoint's answer servelab could not use, as a measured outcome."""
    run_id: str
    t_unix: float
    endpoint: str
    outcome: str
    detail: str | None = None


# table name -> its row type (the contract test walks this).
TABLE_ROWS = {"requests": RequestRow, "runs": RunRow, "run_classes": ClassRow,
              "stages": StageRow, "run_workers": WorkerAccount, "client_health": HealthRow,
              "server_metrics": MetricSample, "stored_batches": StoredBatch,
              "endpoint_events": EndpointEvent, "server_spans": SpanRow}
