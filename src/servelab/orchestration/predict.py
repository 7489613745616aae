"""``servelab predict``: a traffic profile through the simulator's engine in virtual time.

The same engines the simulated server runs, driven without sleeping by the virtual users of
``servelab.sim.engine.virtual_users`` (the one user model, shared with the calibration),
replay the profile's stages: closed-loop users (each sends its next request when the previous one
finished, after the session's think time), open-loop arrivals at their planned times. Stages are
timed as ``servelab run`` times them (``sim.engine.virtual_stages``, the one time model): users
spawned in Locust's batches at the spawn rate and carried over between stages, a level reached
when every user runs, then warm-up and hold, stage ends on the shape's one-second ticks. The
result is stored as a run flagged ``predicted`` in the same tables a measured run uses: requests
with chunk offsets and tokens per chunk, stages with their measured windows, and server metrics
sampled from the engines each second, so every view and report works on it.

Differences from a measured run, by design: no HTTP, tokenizer or client (no ``client_health``);
a request longer than ``max-model-len`` is recorded as vLLM's 400 without reaching the engine;
a user stopped by a lower level sends nothing more but its request in flight finishes (Locust
kills it mid-stream).
An open-loop stage's ``max_in_flight`` holds arrivals back as the load generator does: one cap
per stage, an arrival that finds it full waits for a slot (``late`` when sent more than
``LATE_MS`` after its time) and is ``dropped`` if still waiting when its stage ends (the last
stage waits until the run drains); later turns of a session wait for a slot too.
"""
from __future__ import annotations

import os
import platform
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from servelab import __version__
from servelab.sim.engine.costs import resolve_cost
from servelab.sim.engine.kv_offload import LOAD, STORE
from servelab.specs.variants import Variant

FLAG_PREDICTED = "predicted"
WORKER = "predict"
LATE_MS = 10.0  # the load generator's --late-ms default
DROPPED_TEXT = "max_in_flight was reached and no slot freed before the stage ended"
# The canonical metric (the kind's METRICS key) -> the engine sample's field; each kind's
# /metrics name is written, so a predicted SGLang run reads like a scraped one.
_METRICS = [("running", "num_running"), ("waiting", "num_waiting"),
            ("kv_cache_usage", "kv_usage"), ("preemptions", "num_preemptions_total"),
            ("prompt_tokens", "prompt_tokens_total"),
            ("generation_tokens", "generation_tokens_total"),
            ("prefix_cache_queries", "prefix_cache_queries_total"),
            ("prefix_cache_hits", "prefix_cache_hits_total")]
_SPEC_METRICS = [("spec_drafts", "spec_num_drafts_total"),
                 ("spec_draft_tokens", "spec_num_draft_tokens_total"),
                 ("spec_accepted_tokens", "spec_num_accepted_tokens_total")]
# The CPU KV-offload tier's counters, written only where a tier exists (as vLLM exposes
# kv_offload_* only with its OffloadingConnector); the bytes are one series per transfer_type.
_OFFLOAD_METRICS = [("offload_queries", "offload_queries_total", {}),
                    ("offload_hits", "offload_hits_total", {}),
                    ("offload_bytes", "offload_load_bytes_total", {"transfer_type": LOAD}),
                    ("offload_bytes", "offload_store_bytes_total", {"transfer_type": STORE})]


def metric_names(kind, speculative: bool, offload: bool = False) -> list[tuple[str, str, dict]]:
    """(exposed name, sample field, extra labels) for one kind; a series two concepts share
    (SGLang counts its prefix-cache queries as prompt tokens) is written once."""
    out, seen = [], set()
    rows = ([(k, a, {}) for k, a in _METRICS + (_SPEC_METRICS if speculative else [])]
            + (_OFFLOAD_METRICS if offload else []))
    for key, attr, labels in rows:
        name = kind.metrics.get(key)
        series = (name, tuple(sorted(labels.items())))
        if name is not None and series not in seen:
            seen.add(series)
            out.append((name, attr, labels))
    return out


@dataclass
class PredictResult:
    run_id: str
    requests: int
    errors: int
    virtual_s: float
    wall_s: float
    stages: int


def _turn(planned, stage):
    """A planned request as a virtual user's turn, tagged with what the rows need back (a
    closed-loop turn's stage is None: it is the stage running when the turn is sent, as in the
    load generator, where users carry over from stage to stage)."""
    from servelab.sim.engine.virtual import VirtualRequest
    from servelab.sim.engine.virtual_users import UserTurn

    rid = f"p{planned.index}"
    if planned.turns > 1:  # a session turn resends the whole history: the prefix cache can hit
        req = VirtualRequest(planned.prompt_tokens, planned.output_tokens,
                             class_name=planned.class_name, request_id=rid)
    else:  # a single request: shared-prefix groups via the runner's ids
        req = VirtualRequest(planned.prompt_tokens, planned.output_tokens,
                             prefix_group=planned.prefix_group, prefix_len=planned.prefix_tokens,
                             class_name=planned.class_name, request_id=rid)
    think = 0.0 if planned.turn == 1 else planned.think_time_s
    return UserTurn(req, think, resend_history=planned.turns > 1, tag=(planned, stage))


class Predictor:
    def __init__(self, variant: Variant, hardware: str, profile_path: str | Path,
                 seed: int | None = None, sample_interval_s: float = 1.0):
        from servelab.profiles import load_profile
        from servelab.profiles.planner import RequestPlanner
        from servelab.sim.engine.balancer import make_engines
        from servelab.specs.engine_config import build_kind_engine_config

        self.variant = variant
        self.hardware = hardware
        self.profile_path = Path(profile_path)
        self.profile = load_profile(profile_path)
        self.planner = RequestPlanner(self.profile, seed)
        self.seed = self.planner.seed
        self.config = build_kind_engine_config(hardware, variant.model, variant.serve_args,
                                               variant.kind)
        if variant.pd is not None:  # two pools: prefill engines, then decode engines
            from servelab.sim.engine.disagg import make_pd_engines

            self.engines = make_pd_engines(self.config, variant.pd.prefill, variant.pd.decode,
                                           self.seed)
        else:
            self.engines = make_engines(self.config, self.seed,
                                        count=self.config.data_parallel_size * variant.instances)
        self.sample_interval_s = sample_interval_s
        self.stages = self.planner.stages()
        self.users = None

    def run(self) -> tuple[object, list]:
        """The profile's stages timed as ``servelab run`` times them (``virtual_stages``: Locust's
        spawn batches and one-second ticks, reached, warm-up, hold): closed-loop users that live
        across stages and take sessions from the planner, or open-loop arrivals each starting a
        session under the stage's max_in_flight cap (dropped at the stage's end; the last stage
        drains). Returns the result and the ``StageWindow`` of every stage."""
        from servelab.sim.engine.virtual import InFlightCap
        from servelab.sim.engine.virtual_stages import closed_loop_plan, open_loop_windows
        from servelab.sim.engine.virtual_users import VirtualUsers

        self.users = users = VirtualUsers(self._runner())
        if self.planner.load_kind in ("concurrency", "ramp"):
            sessions = self.planner.sessions()

            def next_session():
                return [_turn(p, None) for p in next(sessions)]

            windows, spans = closed_loop_plan(self.stages)
            for span in spans:
                users.add_user(span.start, span.stop, next_session)
            return self._run(users, windows), windows
        windows = open_loop_windows(self.stages)
        for st, win in zip(self.stages, windows):
            cap = InFlightCap(st.max_in_flight) if st.max_in_flight else None
            give_up = None if st is self.stages[-1] else win.end
            turns: list = []
            for planned in self.planner.arrivals(st.index) + [None]:
                if turns and (planned is None or planned.turn == 1):
                    at = win.start + turns[0].arrival_s
                    users.add_session([_turn(p, st) for p in turns], at, cap, give_up)
                    turns = []
                if planned is not None:
                    turns.append(planned)
        return self._run(users, windows), windows

    def _run(self, users, windows):
        """The virtual run, with a bar of virtual seconds against the plan's (stderr, on a
        terminal, after 2 s: core.bars)."""
        from servelab.core.bars import bar

        planned = max((w.end for w in windows), default=0.0)
        with bar(f"predicting {self.variant.name} (virtual s)", int(planned) or None) as advance:
            users.runner.progress = lambda _t: advance()
            return users.run()

    def _runner(self):
        from servelab.sim.engine.virtual import VirtualRunner

        pd = self.variant.pd
        if pd is None:
            return VirtualRunner(self.engines, self.sample_interval_s)
        from servelab.sim.engine.disagg import DisaggRunner
        from servelab.sim.engine.kv_transfer import kv_link

        return DisaggRunner(self.engines, pd.prefill, kv_link(self.config, pd.kv_link_gb_s),
                            self.sample_interval_s)

    def pd_settings(self) -> dict:
        """The KV transfer's assumed link and what it cost, for a PD variant's run record."""
        runner = self.users.runner if self.users is not None else None
        transfers = getattr(runner, "transfers", None)
        if transfers is None:
            return {}
        link = runner.link
        mean = sum(s for _, _, s in transfers) / len(transfers) if transfers else 0.0
        return {"kv_transfer": {"link": link.kind, "one_way_gb_s": link.one_way_gb_s,
                                "efficiency": link.params.efficiency[link.kind],
                                "latency_s": link.params.latency_s,
                                "bytes_per_token": link.bytes_per_token,
                                "transfers": len(transfers), "mean_ms": mean * 1000,
                                "assumed": True}}

    # -- rows -----------------------------------------------------------------------------------
    def rows(self, run_id: str, result, windows: list, anchor: float) -> dict[str, list]:
        from servelab.store.rows import StageRow

        open_loop = self.planner.load_kind in ("rate", "trace")
        users = self.users
        outcomes = ([(users.submitted[r.request_id], r) for r in sorted(result.records, key=lambda r: r.sent_s)]
                    + [(sub, None) for sub in users.rejected]
                    + [(users.submitted[d.request_id], d) for d in result.dropped])
        requests = [self._request_row(run_id, seq, sub, outcome, windows, anchor, open_loop)
                    for seq, (sub, outcome) in enumerate(outcomes, start=1)]
        stages = [StageRow(run_id, st.index, st.kind, st.level, anchor + w.start,
                           None if w.reached is None else anchor + w.reached,
                           anchor + w.measure_start, anchor + w.measure_end, anchor + w.end)
                  for st, w in zip(self.stages, windows)]
        return {"requests": requests, "stages": stages,
                "server_metrics": self._metric_rows(run_id, result, anchor)}

    def _request_row(self, run_id: str, seq: int, sub, outcome, windows, anchor: float,
                     open_loop: bool):
        """One request's row: a ClientRecord (answered), None (rejected: vLLM's 400 for a prompt
        over max-model-len) or a DroppedRequest (held back by max_in_flight, never sent)."""
        from servelab.sim.engine.virtual import ClientRecord, DroppedRequest
        from servelab.sim.engine.virtual_stages import in_warmup, stage_at
        from servelab.store.rows import RequestRow, dropped_arrival

        planned, stage = sub.turn.tag
        if stage is None:   # closed loop: the stage running when it was sent
            stage = self.stages[stage_at(windows, sub.sent_s).stage]
        win = windows[stage.index]
        if isinstance(outcome, DroppedRequest):
            return dropped_arrival(run_id, sub.request_id, WORKER, seq, planned, stage.index,
                                   stage.level, in_warmup(win, outcome.scheduled_s),
                                   anchor + outcome.scheduled_s, anchor + outcome.dropped_s,
                                   DROPPED_TEXT)
        row = RequestRow(run_id=run_id, request_id=sub.request_id, worker=WORKER, worker_seq=seq,
                         scheduled_unix=None if sub.scheduled_s is None else anchor + sub.scheduled_s)
        row.plan(planned, stage.index, stage.level)
        if outcome is None:
            row.warmup = in_warmup(win, sub.sent_s)
            row.sent_unix = anchor + sub.sent_s
            row.done_unix = anchor + sub.sent_s + 0.001
            row.token_source = "estimated"
            row.http_status = 400
            row.error_kind = "http_400"
            row.error_text = (f"This model's maximum context length is "
                              f"{self.config.max_model_len} tokens.")
            row.arrival_status = "on_time" if open_loop else None
            return row
        rec: ClientRecord = outcome
        sent = rec.sent_s
        last = rec.chunk_times[-1] if rec.chunk_times else None
        row.warmup = in_warmup(win, sent)
        row.sent_unix = anchor + sent
        row.first_token_unix = None if rec.first_token_s is None else anchor + rec.first_token_s
        row.last_token_unix = None if last is None else anchor + last
        row.done_unix = None if rec.end_s is None else anchor + rec.end_s
        row.ttft_ms = None if rec.ttft is None else rec.ttft * 1000
        row.e2e_ms = None if last is None else (last - sent) * 1000
        row.chunk_offsets_ms = [(t - sent) * 1000 for t in rec.chunk_times]
        row.chunk_tokens = rec.chunk_tokens
        row.prompt_tokens = rec.prompt_tokens
        row.output_tokens = rec.output_tokens
        row.token_source = row.chunk_token_source = "usage"
        row.cached_tokens = rec.cached_tokens
        row.finish_reason = rec.finish_reason
        row.http_status = 200
        row.error_kind = None if rec.end_s is not None else "cut"
        if open_loop:
            late = sub.scheduled_s is not None and (sent - sub.scheduled_s) * 1000 > LATE_MS
            row.arrival_status = "late" if late else "on_time"
        return row

    def _metric_rows(self, run_id: str, result, anchor: float) -> list:
        from servelab.store.rows import MetricSample

        model = self.config.served_model_name
        names = metric_names(self.variant.kind, self.config.speculative is not None,
                             self.config.kv_offload)
        rows = []
        for s in result.samples:
            labels = {"engine": str(s.engine_index), "model_name": model}
            rows.extend(MetricSample(run_id, anchor + s.t, name, {**labels, **extra},
                                     float(getattr(s, attr)))
                        for name, attr, extra in names)
        return rows


def predict(variant: Variant, hardware: str, profile_path: str | Path, db_path: str | Path,
            seed: int | None = None, tags: dict | None = None) -> PredictResult:
    from servelab.analysis.views import open_results_db
    from servelab.store.db import Store
    from servelab.store.rows import RunRow, WorkerAccount, class_rows

    wall0 = time.perf_counter()
    predictor = Predictor(variant, hardware, profile_path, seed)
    result, windows = predictor.run()
    run_id = time.strftime("pred-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    anchor = time.time()
    rows = predictor.rows(run_id, result, windows, anchor)
    profile = predictor.profile
    config = predictor.config
    end = max([r.done_unix or r.sent_unix for r in rows["requests"]] + [anchor])
    run = RunRow(
        run_id=run_id, started_unix=anchor, finished_unix=end,
        profile_name=profile.name, profile_path=str(profile_path),
        profile_text=Path(profile_path).read_text(encoding="utf-8"),
        load_kind=predictor.planner.load_kind, target=f"predict://{config.hardware.name}",
        variant=variant.name, hardware=config.hardware.name, model=variant.model,
        gpus=variant.gpus, tags={str(k): str(v) for k, v in (tags or {}).items()},
        servelab_version=__version__, workers=0, status="completed",
        host_info={"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                   "python": platform.python_version()},
        flags=[FLAG_PREDICTED],
        settings={"command": "predict", "seed": predictor.seed, "variant": variant.to_record(),
                  "hardware": config.hardware.name, "kernel_path": config.quant.name,
                  "max_num_seqs": config.max_num_seqs,
                  "max_num_batched_tokens": config.max_num_batched_tokens,
                  "kv_cache_tokens": predictor.engines[0].kv_plan.kv_tokens,
                  "virtual_s": result.end_s, "cost_model": resolve_cost(config)[1],
                  **predictor.pd_settings()},
        notes="predicted by the simulator's engine in virtual time; not a measurement",
    )
    n = len(rows["requests"])
    con = open_results_db(db_path)
    store = Store(con)
    try:
        store.append_rows("runs", [run])
        store.append_rows("run_classes", class_rows(run_id, profile))
        store.append_rows("stages", rows["stages"])
        store.append_rows("requests", rows["requests"])
        store.append_rows("server_metrics", rows["server_metrics"])
        store.append_rows("run_workers", [WorkerAccount(run_id, WORKER, socket.gethostname(),
                                                        produced=n, stored=n, in_flight_lost=0,
                                                        status="finished")])
    finally:
        store.close()
    errors = sum(1 for r in rows["requests"] if r.error_kind)
    return PredictResult(run_id, n, errors, result.end_s, time.perf_counter() - wall0,
                         len(rows["stages"]))


def render(result: PredictResult, variant: Variant, hardware: str, db_path) -> str:
    return (f"predicted {variant.name} on {hardware}: run {result.run_id}, {result.requests} "
            f"requests ({result.errors} errors) in {result.stages} stages, "
            f"{result.virtual_s:.1f} s of virtual time in {result.wall_s:.2f} s; "
            f"stored in {db_path} (flag '{FLAG_PREDICTED}')")
