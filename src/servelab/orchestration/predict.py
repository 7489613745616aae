"""``servelab predict``: a traffic profile through the simulator's engine in virtual time.

The same engines the simulated server runs, driven by ``servelab.sim.virtual`` without sleeping,
replay the profile's stages: closed-loop users (each sends its next request when the previous one
finished, after the session's think time), ramps at their spawn rate, open-loop arrivals at their
planned times. The result is stored as a run flagged ``predicted`` in the same tables a measured
run uses: requests with chunk offsets and tokens per chunk, stages with their measured windows,
and server metrics sampled from the engines each second, so every view and report works on it.

Differences from a measured run, by design: no HTTP, tokenizer or client (no ``client_health``);
a request longer than ``max-model-len`` is recorded as vLLM's 400 without reaching the engine.
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
from dataclasses import dataclass, field
from pathlib import Path

from servelab import __version__
from servelab.specs.variants import Variant

FLAG_PREDICTED = "predicted"
WORKER = "predict"
LATE_MS = 10.0  # the load generator's --late-ms default
DROPPED_TEXT = "max_in_flight was reached and no slot freed before the stage ended"
_ID_BASE = 1 << 41  # explicit token ids of sessions, above the virtual runner's own ranges


@dataclass
class _Sent:
    """What the planner asked for, kept per request id until its record comes back."""
    planned: object
    stage: object
    measure_start: float
    scheduled_s: float | None


@dataclass
class _User:
    """Sends a session's turns in order, each after the previous answer and its think time.
    Closed loop: takes the next session when one ends, until its stop time. Open loop: one
    session (``endless`` False), started at its arrival time."""
    stop_s: float
    stage: object
    session: list = field(default_factory=list)
    turn: int = 0
    history: list = field(default_factory=list)
    endless: bool = True
    scheduled_s: float | None = None
    cap: object = None                 # the stage's InFlightCap (open loop with max_in_flight)
    give_up_s: float | None = None     # a first turn still waiting then is dropped


@dataclass
class PredictResult:
    run_id: str
    requests: int
    errors: int
    virtual_s: float
    wall_s: float
    stages: int


def _stage_windows(stages, ramp_users: dict[int, float]) -> list[dict]:
    """Virtual start/reached/measure/end times of each stage (stages run back to back)."""
    out, t = [], 0.0
    for st in stages:
        reached = t + ramp_users.get(st.index, 0.0)
        measure_start = reached + st.warmup_s
        out.append({"stage": st.index, "start": t, "reached": reached,
                    "measure_start": measure_start, "measure_end": measure_start + st.hold_s,
                    "end": t + st.duration_s})
        t += st.duration_s
    return out


class Predictor:
    def __init__(self, variant: Variant, hardware: str, profile_path: str | Path,
                 seed: int | None = None, sample_interval_s: float = 1.0):
        from servelab.profiles import load_profile
        from servelab.profiles.planner import RequestPlanner
        from servelab.sim.balancer import make_engines
        from servelab.specs.engine_config import build_engine_config

        self.variant = variant
        self.hardware = hardware
        self.profile_path = Path(profile_path)
        self.profile = load_profile(profile_path)
        self.planner = RequestPlanner(self.profile, seed)
        self.seed = self.planner.seed
        self.config = build_engine_config(hardware, variant.model, list(variant.serve_args))
        self.engines = make_engines(self.config, self.seed,
                                    count=self.config.data_parallel_size * variant.instances)
        self.sample_interval_s = sample_interval_s
        self.stages = self.planner.stages()
        self._sent: dict[str, _Sent] = {}
        self._rejected: list[tuple[str, _Sent, float]] = []
        self._users: dict[str, _User] = {}
        self._ids = 0

    # -- building requests ----------------------------------------------------------------------
    def _virtual_request(self, planned, history: list[int] | None):
        from servelab.sim.virtual import VirtualRequest

        rid = f"p{planned.index}"
        if history is None:  # a single request: shared-prefix groups via the runner's ids
            return VirtualRequest(planned.prompt_tokens, planned.output_tokens,
                                  prefix_group=planned.prefix_group,
                                  prefix_len=planned.prefix_tokens, class_name=planned.class_name,
                                  request_id=rid), None
        # A session turn resends the whole history: equal ids, so the prefix cache can hit.
        new = list(range(_ID_BASE + self._ids, _ID_BASE + self._ids + planned.prompt_tokens))
        self._ids += planned.prompt_tokens + planned.output_tokens
        ids = history + new
        output_ids = list(range(_ID_BASE + self._ids - planned.output_tokens, _ID_BASE + self._ids))
        return VirtualRequest(len(ids), planned.output_tokens, prompt_token_ids=ids,
                              class_name=planned.class_name, request_id=rid), ids + output_ids

    def _submit(self, runner, planned, stage, window, sent_s: float, scheduled_s: float | None,
                history: list[int] | None, cap=None, give_up_s: float | None = None):
        req, new_history = self._virtual_request(planned, history)
        info = _Sent(planned, stage, window["measure_start"], scheduled_s)
        if req.prompt_len + req.output_len > self.config.max_model_len:
            # vLLM answers with 400 before the engine sees it; the user goes on at once.
            self._rejected.append((req.request_id, info, sent_s))
            return req.request_id, new_history, True
        self._sent[req.request_id] = info
        runner.submit(req, sent_s, cap, give_up_s)
        return req.request_id, new_history, False

    # -- closed loop --------------------------------------------------------------------------
    def _next_turn(self, runner, user: _User, sessions, window, now: float) -> None:
        while now < user.stop_s:
            if user.turn >= len(user.session):
                if not user.endless:
                    return
                user.session, user.turn, user.history = next(sessions), 0, []
            planned = user.session[user.turn]
            user.turn += 1
            first = planned.turn == 1
            sent = now + (0.0 if first else planned.think_time_s)
            if sent >= user.stop_s:
                return
            multi = planned.turns > 1
            scheduled = user.scheduled_s if first else None
            rid, history, rejected = self._submit(runner, planned, user.stage, window, sent,
                                                  scheduled, user.history if multi else None,
                                                  user.cap, user.give_up_s if first else None)
            if multi:
                user.history = history
            if not rejected:
                self._users[rid] = user
                return
            now = sent + 0.001

    def run(self) -> tuple[object, list[dict]]:
        from servelab.sim.virtual import InFlightCap, VirtualRunner

        runner = VirtualRunner(self.engines, self.sample_interval_s)
        sessions = self.planner.sessions() if self.planner.load_kind != "trace" else None
        ramp_reach = {}
        users_before = 0
        for st in self.stages:
            if st.kind == "ramp" and st.spawn_rate and st.users:
                ramp_reach[st.index] = max(0, st.users - users_before) / st.spawn_rate
            users_before = st.users or 0
        windows = _stage_windows(self.stages, ramp_reach)

        def finished(rec, t):
            user = self._users.pop(rec.request_id, None)
            if user is not None:
                self._next_turn(runner, user, sessions, windows[user.stage.index], t)

        runner.on_finish = finished
        for st, win in zip(self.stages, windows):
            if st.kind in ("concurrency", "ramp"):
                users = st.users or 0
                for u in range(users):
                    start = win["start"]
                    if st.kind == "ramp" and st.spawn_rate:
                        start += u / st.spawn_rate
                    user = _User(stop_s=win["end"], stage=st)
                    self._next_turn(runner, user, sessions, win, start)
            else:
                # Open loop: each arrival starts a session (usually of one request).
                cap = InFlightCap(st.max_in_flight) if st.max_in_flight else None
                give_up = None if st is self.stages[-1] else win["end"]
                turns: list = []
                for planned in self.planner.arrivals(st.index) + [None]:
                    if turns and (planned is None or planned.turn == 1):
                        at = win["start"] + turns[0].arrival_s
                        user = _User(stop_s=float("inf"), stage=st, session=turns,
                                     endless=False, scheduled_s=at, cap=cap, give_up_s=give_up)
                        self._next_turn(runner, user, None, win, at)
                        turns = []
                    if planned is not None:
                        turns.append(planned)
        result = runner.run()
        return result, windows

    # -- rows -----------------------------------------------------------------------------------
    def rows(self, run_id: str, result, windows: list[dict], anchor: float) -> dict[str, list]:
        open_loop = self.planner.load_kind in ("rate", "trace")
        requests, seq = [], 0
        for rec in sorted(result.records, key=lambda r: r.sent_s):
            info = self._sent[rec.request_id]
            p = info.planned
            seq += 1
            last = rec.chunk_times[-1] if rec.chunk_times else None
            arrival_status = None
            if open_loop:
                late = (info.scheduled_s is not None
                        and (rec.sent_s - info.scheduled_s) * 1000 > LATE_MS)
                arrival_status = "late" if late else "on_time"
            requests.append({
                "run_id": run_id, "request_id": rec.request_id, "worker": WORKER,
                "worker_seq": seq, "class_name": p.class_name, "stage": info.stage.index,
                "level": info.stage.level, "warmup": rec.sent_s < info.measure_start,
                "scheduled_unix": None if info.scheduled_s is None else anchor + info.scheduled_s,
                "sent_unix": anchor + rec.sent_s,
                "first_token_unix": None if rec.first_token_s is None else anchor + rec.first_token_s,
                "last_token_unix": None if last is None else anchor + last,
                "done_unix": None if rec.end_s is None else anchor + rec.end_s,
                "ttft_ms": None if rec.ttft is None else rec.ttft * 1000,
                "e2e_ms": None if last is None else (last - rec.sent_s) * 1000,
                "chunk_offsets_ms": [(t - rec.sent_s) * 1000 for t in rec.chunk_times],
                "chunk_tokens": rec.chunk_tokens,
                "prompt_tokens_target": p.prompt_tokens, "prompt_tokens": rec.prompt_tokens,
                "output_tokens_target": p.output_tokens, "output_tokens": rec.output_tokens,
                "token_source": "usage", "chunk_token_source": "usage",
                "cached_tokens": rec.cached_tokens,
                "finish_reason": rec.finish_reason, "http_status": 200,
                "error_kind": None if rec.end_s is not None else "cut",
                "error_text": None, "arrival_status": arrival_status,
                "prefix_group": p.prefix_group,
                "session_id": None if p.session_id is None else str(p.session_id),
                "turn": p.turn})
        for rid, info, sent_s in self._rejected:
            p = info.planned
            seq += 1
            requests.append({
                "run_id": run_id, "request_id": rid, "worker": WORKER, "worker_seq": seq,
                "class_name": p.class_name, "stage": info.stage.index, "level": info.stage.level,
                "warmup": sent_s < info.measure_start,
                "scheduled_unix": None if info.scheduled_s is None else anchor + info.scheduled_s,
                "sent_unix": anchor + sent_s, "done_unix": anchor + sent_s + 0.001,
                "chunk_offsets_ms": [], "chunk_tokens": [],
                "prompt_tokens_target": p.prompt_tokens, "output_tokens_target": p.output_tokens,
                "token_source": "estimated", "http_status": 400, "error_kind": "http_400",
                "error_text": f"This model's maximum context length is "
                              f"{self.config.max_model_len} tokens.",
                "arrival_status": "on_time" if open_loop else None,
                "prefix_group": p.prefix_group,
                "session_id": None if p.session_id is None else str(p.session_id),
                "turn": p.turn})
        for d in result.dropped:
            info = self._sent[d.request_id]
            p = info.planned
            seq += 1
            requests.append({
                "run_id": run_id, "request_id": d.request_id, "worker": WORKER, "worker_seq": seq,
                "class_name": p.class_name, "stage": info.stage.index, "level": info.stage.level,
                "warmup": d.scheduled_s < info.measure_start,
                "scheduled_unix": anchor + d.scheduled_s, "done_unix": anchor + d.dropped_s,
                "chunk_offsets_ms": [], "chunk_tokens": [],
                "prompt_tokens_target": p.prompt_tokens, "output_tokens_target": p.output_tokens,
                "error_kind": "dropped", "error_text": DROPPED_TEXT, "arrival_status": "dropped",
                "prefix_group": p.prefix_group,
                "session_id": None if p.session_id is None else str(p.session_id),
                "turn": p.turn})
        stages = [{"run_id": run_id, "stage": st.index, "kind": st.kind, "level": st.level,
                   "started_unix": anchor + w["start"], "reached_unix": anchor + w["reached"],
                   "measure_start_unix": anchor + w["measure_start"],
                   "measure_end_unix": anchor + w["measure_end"],
                   "ended_unix": anchor + w["end"]} for st, w in zip(self.stages, windows)]
        return {"requests": requests, "stages": stages,
                "server_metrics": self._metric_rows(run_id, result, anchor)}

    def _metric_rows(self, run_id: str, result, anchor: float) -> list[dict]:
        model = self.config.served_model_name
        spec = self.config.speculative is not None
        names = [("vllm:num_requests_running", "num_running"),
                 ("vllm:num_requests_waiting", "num_waiting"),
                 ("vllm:kv_cache_usage_perc", "kv_usage"),
                 ("vllm:num_preemptions_total", "num_preemptions_total"),
                 ("vllm:prompt_tokens_total", "prompt_tokens_total"),
                 ("vllm:generation_tokens_total", "generation_tokens_total"),
                 ("vllm:prefix_cache_queries_total", "prefix_cache_queries_total"),
                 ("vllm:prefix_cache_hits_total", "prefix_cache_hits_total")]
        if spec:
            names += [("vllm:spec_decode_num_drafts_total", "spec_num_drafts_total"),
                      ("vllm:spec_decode_num_draft_tokens_total", "spec_num_draft_tokens_total"),
                      ("vllm:spec_decode_num_accepted_tokens_total",
                       "spec_num_accepted_tokens_total")]
        rows = []
        for s in result.samples:
            labels = {"engine": str(s.engine_index), "model_name": model}
            for name, attr in names:
                rows.append({"run_id": run_id, "t_unix": anchor + s.t, "name": name,
                             "labels": labels, "value": float(getattr(s, attr))})
        return rows


def predict(variant: Variant, hardware: str, profile_path: str | Path, db_path: str | Path,
            seed: int | None = None, tags: dict | None = None) -> PredictResult:
    from servelab.analysis.views import open_results_db
    from servelab.store.db import Store

    wall0 = time.perf_counter()
    predictor = Predictor(variant, hardware, profile_path, seed)
    result, windows = predictor.run()
    run_id = time.strftime("pred-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    anchor = time.time()
    rows = predictor.rows(run_id, result, windows, anchor)
    profile = predictor.profile
    config = predictor.config
    end = max([r["done_unix"] or r["sent_unix"] for r in rows["requests"]] + [anchor])
    run = {
        "run_id": run_id, "started_unix": anchor, "finished_unix": end,
        "profile_name": profile.name, "profile_path": str(profile_path),
        "profile_text": Path(profile_path).read_text(encoding="utf-8"),
        "load_kind": predictor.planner.load_kind, "target": f"predict://{config.hardware.name}",
        "variant": variant.name, "hardware": config.hardware.name, "model": variant.model,
        "gpus": variant.gpus, "tags": {str(k): str(v) for k, v in (tags or {}).items()},
        "servelab_version": __version__, "workers": 0, "status": "completed",
        "host_info": {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                      "python": platform.python_version()},
        "flags": [FLAG_PREDICTED],
        "settings": {"command": "predict", "seed": predictor.seed, "variant": variant.to_record(),
                     "hardware": config.hardware.name, "kernel_path": config.quant.name,
                     "max_num_seqs": config.max_num_seqs,
                     "max_num_batched_tokens": config.max_num_batched_tokens,
                     "kv_cache_tokens": predictor.engines[0].kv_plan.kv_tokens,
                     "virtual_s": result.end_s},
        "notes": "predicted by the simulator's engine in virtual time; not a measurement",
    }
    classes = [{"run_id": run_id, "class_name": c.name, "weight": c.weight,
                "slo_ttft_ms": c.slo.ttft_ms, "slo_tpot_ms": c.slo.tpot_ms,
                "slo_itl_ms": c.slo.itl_ms, "slo_e2e_ms": c.slo.e2e_ms} for c in profile.classes]
    n = len(rows["requests"])
    con = open_results_db(db_path)
    store = Store(con)
    try:
        store.append_rows("runs", [run])
        store.append_rows("run_classes", classes)
        store.append_rows("stages", rows["stages"])
        store.append_rows("requests", rows["requests"])
        store.append_rows("server_metrics", rows["server_metrics"])
        store.append_rows("run_workers", [{"run_id": run_id, "worker": WORKER,
                                           "host": socket.gethostname(), "produced": n,
                                           "stored": n, "in_flight_lost": 0,
                                           "status": "finished"}])
    finally:
        store.close()
    errors = sum(1 for r in rows["requests"] if r["error_kind"])
    return PredictResult(run_id, n, errors, result.end_s, time.perf_counter() - wall0,
                         len(rows["stages"]))


def render(result: PredictResult, variant: Variant, hardware: str, db_path) -> str:
    return (f"predicted {variant.name} on {hardware}: run {result.run_id}, {result.requests} "
            f"requests ({result.errors} errors) in {result.stages} stages, "
            f"{result.virtual_s:.1f} s of virtual time in {result.wall_s:.2f} s; "
            f"stored in {db_path} (flag '{FLAG_PREDICTED}')")
