"""``servelab search``: the highest load (users, or requests/s) at which a server keeps a share of
requests within their SLOs, found by probing instead of sweeping.

The profile's classes and SLOs stay; its plan becomes the levels searched: a geometric grid from
--min to --max, one resolution step apart, with the profile's warm-up and hold per level. That
profile is written beside the run's logs and run by ``servelab run`` (orchestration.runner) in
the plan mode ``search``: the Locust master probes one level at a time, bisecting between the
last level met and the first missed (loadgen.search_shape, rules in loadgen.search_rules), every
probe a stage of the one run. With a known variant and hardware the first probe is at the limit
``servelab predict`` finds in virtual time by the same rules (orchestration.search_virtual).
Afterwards the stored run is read back (loadgen.search_reads): that is the answer.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from servelab.core.errors import ServelabError
from servelab.loadgen.search_rules import (DEFAULT_MAX_ERROR_RATE, DEFAULT_RESOLUTION,
                                           DEFAULT_TARGET, level_grid, plain_bisection_probes)

DEFAULT_HARDWARE = "L40S"   # the simulator's, when servelab run starts one without --hardware


@dataclass
class SearchOptions:
    run: object                       # orchestration.runner.RunOptions (profile, target, ...)
    over: str | None = None           # concurrency | rate (default: the profile's plan)
    target: float = DEFAULT_TARGET    # --slo-attainment
    low: float | None = None          # --min (default: the plan's lowest level)
    high: float | None = None         # --max (default: its highest)
    resolution: float = DEFAULT_RESOLUTION
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    predict: bool = True              # seed by predict when the variant and hardware are known
    warmup_s: float | None = None     # default: the profile's
    hold_s: float | None = None


@dataclass
class SearchPlan:
    over: str
    levels: list[float]
    warmup_s: float
    hold_s: float
    extra: dict                       # a rate plan's arrival, burstiness, max_in_flight

    @property
    def unit(self) -> str:
        return "requests/s" if self.over == "rate" else "users"

    def load(self) -> dict:
        """The searched profile's plan (one stage per level, in the profile's own language)."""
        if self.over == "concurrency":
            return {"concurrency": {"levels": [int(v) for v in self.levels],
                                    "warmup": self.warmup_s, "hold": self.hold_s}}
        return {"rate": {"rates": self.levels, "warmup": self.warmup_s,
                         "duration": self.hold_s, **self.extra}}


@dataclass
class SearchOutcome:
    run: object                       # runner.RunResult
    plan: SearchPlan
    stored: object                    # search_reads.StoredSearch
    prediction: object | None         # search_virtual.Prediction
    seed_note: str                    # how the first level was chosen

    @property
    def answer(self):
        return self.stored.answer

    def exit_code(self) -> int:
        """0 a limit found; 1 the run or the server ended the search early; 3 no level meets."""
        stop = self.answer.stop
        if self.run.status != "completed" or self.run.interrupted or stop in (None,
                                                                               "server_down"):
            return 1
        return 3 if stop == "none_meets" else 0

    def as_json(self) -> dict:
        a = self.answer
        pred = self.prediction
        return {"run_id": self.stored.run_id, "over": self.plan.over, "unit": self.plan.unit,
                "target": self.stored.target, **a.as_json(),
                "requests": self.stored.requests, "levels": len(self.plan.levels),
                "range": [self.plan.levels[0], self.plan.levels[-1]],
                "probes": [p.as_json() for p in self.stored.probes],
                "off_path": self.stored.off_path,
                "seed": self.seed_note,
                "prediction": dict(pred.as_json(), off_by=pred.off_by(a.limit)) if pred else None,
                "bisection_probes_max": plain_bisection_probes(len(self.plan.levels)),
                "status": self.run.status, "exit_code": self.exit_code()}


def search(opt: SearchOptions) -> SearchOutcome:
    """Plan, seed, run and read back one search; bad input raises ``ServelabError``."""
    from servelab.loadgen.options import new_run_id
    from servelab.orchestration.runner import claim_run_id, run_profile
    from servelab.profiles import load_profile
    from servelab.store.spool import check_id

    profile = load_profile(opt.run.profile)
    plan = search_plan(profile, opt)
    if opt.run.target:   # before the prediction: a server that is not there is bad input
        from servelab.core import credentials
        from servelab.orchestration.runner import check_target

        check_target(credentials.split_url(opt.run.target)[0].rstrip("/"))
    db = _db_path(opt.run.db)
    run_id = check_id(opt.run.run_id or new_run_id(), "--run-id")
    claim_run_id(db, run_id)   # refused before anything is written into the run's log folder
    path = db.parent / "logs" / run_id / "search_profile.yaml"
    write_search_profile(profile, plan, path)
    load_profile(path)   # the plan the master will read: refused here, not in Locust
    prediction, note = _seed(opt, plan, path)
    start = plan.levels[prediction.start] if prediction else 0.0
    with _search_mode(opt.target, start, opt.max_error_rate):
        result = run_profile(replace(opt.run, profile=path, run_id=run_id, db=db))
    stored = read_search(db, run_id)
    return SearchOutcome(result, plan, stored, prediction, note)


def search_plan(profile, opt: SearchOptions) -> SearchPlan:
    """The levels and timing searched, from the profile and the flags; bad ones refused with the
    flag that fixes them."""
    kind, plan = profile.load.kind, profile.load.plan
    over = opt.over or (kind if kind in ("concurrency", "rate") else "concurrency")
    if over not in ("concurrency", "rate"):
        raise ServelabError(f"--over {over}: search over concurrency (users) or rate "
                            "(requests/s)")
    if not any(c.slo.thresholds() for c in profile.classes):
        raise ServelabError(f"{profile.path}: no class sets an SLO, so every request meets it; "
                            "give a class one (slo: {ttft_ms: 2000, tpot_ms: 100})")
    if not 0.0 < opt.target < 1.0:
        raise ServelabError(f"--slo-attainment {opt.target:g}: give a share between 0 and 1, "
                            "e.g. 0.95")
    if not 0.01 <= opt.resolution <= 1.0:
        raise ServelabError(f"--resolution {opt.resolution:g}: give a step between 0.01 and 1 "
                            "(0.1: levels 10% apart)")
    warmup = plan.warmup if kind in ("concurrency", "rate") else 0.0
    hold = plan.hold if kind == "concurrency" else plan.duration if kind == "rate" else None
    warmup = warmup if opt.warmup_s is None else opt.warmup_s
    hold = hold if opt.hold_s is None else opt.hold_s
    if not hold or hold <= 0:
        raise ServelabError(f"--hold: the profile's plan is a {kind} plan, with no hold to "
                            "measure each level over; give --hold (and --warmup), e.g. --hold 60")
    if warmup < 0:
        raise ServelabError(f"--warmup {warmup:g}: give 0 or more seconds")
    own = sorted(plan.levels if kind == "concurrency" else plan.rates) if kind == over else []
    low = opt.low if opt.low is not None else (own[0] if own else None)
    high = opt.high if opt.high is not None else (own[-1] if own else None)
    if low is None or high is None:
        raise ServelabError(f"--min and --max: the profile's plan is {kind}, so it names no "
                            f"{over} levels; give the range to search, e.g. --min 1 --max 64")
    _check_range(over, low, high)
    extra = {}
    if kind == "rate" and over == "rate":
        extra = {k: v for k, v in (("arrival", plan.arrival), ("burstiness", plan.burstiness),
                                   ("max_in_flight", plan.max_in_flight)) if v is not None}
    levels = level_grid(low, high, opt.resolution, integer=over == "concurrency")
    return SearchPlan(over, levels, float(warmup), float(hold), extra)


def _check_range(over: str, low: float, high: float) -> None:
    unit = "users" if over == "concurrency" else "requests/s"
    if low <= 0:
        raise ServelabError(f"--min {low:g}: give a level above 0 {unit}")
    if low > high:
        raise ServelabError(f"--min {low:g} is above --max {high:g}: give a --min at or below "
                            "--max")
    if over == "concurrency" and (low != int(low) or high != int(high)):
        raise ServelabError(f"--min {low:g} --max {high:g}: users are whole numbers")


def write_search_profile(profile, plan: SearchPlan, path: Path) -> None:
    """The profile with its plan replaced by the levels searched; the files it names made
    absolute, since the copy lives in the run's log folder, not beside the original."""
    doc = yaml.safe_load(Path(profile.path).read_text(encoding="utf-8"))
    doc["load"] = plan.load()
    _absolute_files(doc, Path(profile.base_dir).resolve(), top=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (f"# Written by servelab search from {profile.path}: the same classes and SLOs, the "
            f"plan replaced by the {len(plan.levels)} levels searched.\n")
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def _absolute_files(node, base: Path, top: bool = False) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and (key == "file" or (top and key == "tokenizer")):
                node[key] = str(base / value) if not Path(value).is_absolute() else value
            else:
                _absolute_files(value, base)
    elif isinstance(node, list):
        for item in node:
            _absolute_files(item, base)


def _seed(opt: SearchOptions, plan: SearchPlan, path: Path):
    """(Prediction or None, how the first level is chosen)."""
    run = opt.run
    hardware = run.hardware or (None if run.target else DEFAULT_HARDWARE)
    if not opt.predict:
        return None, "a bisection from the middle (--no-prediction)"
    if not run.variant or not hardware:
        missing = "--variant" if not run.variant else "--hardware (the target's GPU)"
        return None, f"a bisection from the middle (give {missing} to start at a prediction)"
    from servelab.orchestration.search_virtual import predict_limit
    from servelab.specs.variants import load_variant

    variant = load_variant(run.variant)
    print(f"servelab search: predicting the limit of {variant.name} on {hardware} in virtual "
          f"time ({len(plan.levels)} levels) ...", flush=True)
    pred = predict_limit(variant, hardware, path, plan.over, plan.levels, opt.target,
                         opt.max_error_rate, run.seed)
    where = (f"{pred.limit:g} {plan.unit}" if pred.limit is not None
             else f"none of the levels ({plan.levels[0]:g} {plan.unit} first)")
    return pred, (f"the predicted limit, {where} ({pred.cost_model}; {pred.bisection_probes} "
                  f"probes in {pred.wall_s:.1f} s of virtual search)")


@contextmanager
def _search_mode(target: float, start: float, max_error_rate: float):
    """The Locust master's search options, through the environment its options default from
    (loadgen.options): ``run_profile`` passes its children this process's environment."""
    values = {"SERVELAB_MODE": "search", "SERVELAB_SEARCH_TARGET": repr(float(target)),
              "SERVELAB_SEARCH_START": repr(float(start or 0.0)),
              "SERVELAB_SEARCH_MAX_ERROR_RATE": repr(float(max_error_rate))}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def read_search(db: Path, run_id: str):
    from servelab.analysis.db import open_for_reading
    from servelab.loadgen.search_reads import read_stored_search

    con = open_for_reading(db)
    try:
        return read_stored_search(con, run_id)
    finally:
        con.close()


def _db_path(db) -> Path:
    from servelab.core.paths import default_db

    return Path(db) if db else default_db()


