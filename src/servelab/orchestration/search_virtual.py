"""The search in virtual time: the same rules (``loadgen.search_rules``) over probes that
``servelab predict`` runs through the simulator's engine, each probe a one-level copy of the
search's profile, judged by the same SQL (stage_summary, in a scratch database).

It seeds ``servelab search``: the real search probes the predicted limit first. A calibration
for the hardware, model and kernel path is used when one applies (predict's cost model says
which). It also says how many probes a bisection of the same levels takes without the seed,
which is what the seed saves.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from servelab.loadgen.search_reads import read_probe
from servelab.loadgen.search_rules import Bisection, Probe


@dataclass
class Prediction:
    variant: str
    hardware: str
    cost_model: str
    limit: float | None          # the predicted limit (None: no level meets, predicted)
    start: int                   # the position the real search probes first
    stop: str | None
    bisection_probes: int        # a bisection of the levels, unseeded, in virtual time
    seeded_probes: int           # the same search seeded at the predicted limit
    bisection_requests: int      # the requests each of the two sends (predicted)
    seeded_requests: int
    wall_s: float

    def off_by(self, found: float | None) -> float | None:
        """(predicted - found) / found: how far the prediction was from the limit found."""
        if self.limit is None or not found:
            return None
        return (self.limit - found) / found

    def as_json(self) -> dict:
        return {"variant": self.variant, "hardware": self.hardware, "cost_model": self.cost_model,
                "limit": self.limit, "stop": self.stop,
                "bisection_probes": self.bisection_probes, "seeded_probes": self.seeded_probes,
                "bisection_requests": self.bisection_requests,
                "seeded_requests": self.seeded_requests, "wall_s": round(self.wall_s, 2)}


class _VirtualProbes:
    """Each level predicted once (the engine is deterministic for a seed): both searches share."""

    def __init__(self, variant, hardware: str, profile_path: Path, over: str, levels: list[float],
                 target: float, max_error_rate: float, seed: int | None, tmp: Path):
        self.variant, self.hardware, self.over, self.levels = variant, hardware, over, levels
        self.target, self.max_error_rate, self.seed, self.tmp = target, max_error_rate, seed, tmp
        self.doc = yaml.safe_load(Path(profile_path).read_text(encoding="utf-8"))
        self.db = tmp / "virtual.duckdb"
        self.cache: dict[int, Probe] = {}
        self.sent: dict[int, int] = {}     # position -> requests predicted (warm-up included)
        self.cost_model = "?"

    def measure(self, position: int) -> Probe:
        if position in self.cache:
            return self.cache[position]
        import duckdb

        from servelab.orchestration.predict import predict

        level = self.levels[position]
        plan = dict(self.doc["load"][self.over])
        plan["levels" if self.over == "concurrency" else "rates"] = \
            [int(level) if self.over == "concurrency" else level]
        path = self.tmp / f"level{position}.yaml"
        path.write_text(yaml.safe_dump(dict(self.doc, load={self.over: plan}), sort_keys=False),
                        encoding="utf-8")
        result = predict(self.variant, self.hardware, path, self.db, self.seed)
        con = duckdb.connect(str(self.db), read_only=True)
        try:
            probe = read_probe(con, result.run_id, 0, position, level, self.target,
                               self.max_error_rate)
            row = con.execute("SELECT settings->>'cost_model' FROM runs WHERE run_id = ?",
                              [result.run_id]).fetchone()
        finally:
            con.close()
        self.cost_model = (row[0] if row else None) or self.cost_model
        self.sent[position] = result.requests
        self.cache[position] = probe
        return probe


def run_rules(search: Bisection, measure) -> Bisection:
    """Drive a search to its stop with ``measure(position) -> Probe``."""
    while (position := search.next_position()) is not None:
        search.record(measure(position))
    return search


def predict_limit(variant, hardware: str, profile_path: Path, over: str, levels: list[float],
                  target: float, max_error_rate: float, seed: int | None = None) -> Prediction:
    """The limit the engine predicts, found by the search's own rules in virtual time."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="servelab-search-") as tmp:
        probes = _VirtualProbes(variant, hardware, profile_path, over, levels, target,
                                max_error_rate, seed, Path(tmp))
        plain = run_rules(Bisection(levels), probes.measure)
        answer = plain.answer()
        start = levels.index(answer.limit) if answer.limit is not None else 0
        seeded = run_rules(Bisection(levels, start), probes.measure)
        return Prediction(variant.name, hardware, probes.cost_model, answer.limit, start,
                          plain.stop, len(plain.probes), len(seeded.probes),
                          sum(probes.sent[p.position] for p in plain.probes),
                          sum(probes.sent[p.position] for p in seeded.probes),
                          time.perf_counter() - t0)
