"""The deterministic request sequence and stage plan of a profile.

The sequence is made of *items*: an item is one session (a single request, or the turns of a
multi-turn conversation). Item ``k`` is drawn from the random stream keyed by
``(seed, block = k // BLOCK)`` (numpy SeedSequence spawn keys), so any worker can compute any item
without the others, and splitting the sequence over N workers gives exactly the same items:
item ``k`` belongs to worker ``k % N``. For profiles without sessions an item is a request and
request ``i`` goes to worker ``i % N``; a session's turns always stay with one worker.

Open-loop arrival times come from a separate stream per stage, keyed by ``(seed, stage)``, and are
generated whole, then sharded the same way. Request indices run on across stages, so no two
requests of a run share an index (the prompt builder derives its salt and text offsets from it).

A consumer must treat a session's turns (same ``session_id``, ``turn`` 1..``turns``) as one user:
send them in order, each only after the previous answer arrived and ``think_time_s`` passed, and
resend the growing history (``PromptBuilder.build(request, history)``). In ``arrivals()`` only
turn 1 carries ``arrival_s``; later turns have ``arrival_s=None``.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from servelab.profiles.schema import Profile

BLOCK = 256
_ITEMS, _ARRIVALS = 0, 1   # first spawn-key word: which stream


@dataclass(frozen=True)
class PlannedRequest:
    index: int                  # position in the whole run's sequence (0-based)
    class_name: str
    prompt_tokens: int          # target prompt length; for turn >= 2: the tokens this turn adds
    output_tokens: int          # max_tokens (with ignore_eos, the exact output length)
    prefix_group: int | None    # shared-prefix group, None when the class has no prefix
    session_id: int | None      # item number of a multi-turn session, None for single requests
    turn: int                   # 1-based turn within the session (1 for single requests)
    think_time_s: float         # pause after the previous turn's answer (0 for turn 1)
    arrival_s: float | None     # open loop / trace: send time from the stage start
    turns: int = 1              # number of turns in this session
    prefix_tokens: int = 0      # part of prompt_tokens that is the group's shared prefix


@dataclass(frozen=True)
class StagePlan:
    index: int
    kind: str                   # concurrency | rate | ramp | trace
    level: float | None         # the swept value: users, or requests/s
    users: int | None = None    # closed loop: number of users (concurrency level, ramp target)
    spawn_rate: float | None = None   # users started per second (None: all at once)
    rate: float | None = None   # open loop: requests per second
    warmup_s: float = 0.0       # excluded from measurement, at the start of the stage
    hold_s: float = 0.0         # measured window
    duration_s: float = 0.0     # warmup_s + hold_s
    max_in_flight: int | None = None
    arrival: str | None = None  # poisson | gamma | constant | trace
    burstiness: float | None = None
    time_scale: float | None = None
    expected_requests: float | None = None   # open loop and trace; None for closed loop


class _ClassDraw:
    """Samplers of one class, built once per planner."""

    def __init__(self, spec, trace: bool):
        self.name = spec.name
        self.prefix_tokens = spec.prefix_tokens
        self.groups = spec.groups
        self.prompt = None if trace else spec.prompt_tokens.sampler()
        self.output = None if trace else spec.output_tokens.sampler()
        self.session = spec.session is not None
        if self.session:
            self.max_turns = int(spec.session.turns.upper_bound())
            self.turns = spec.session.turns.sampler()
            self.think = spec.session.think_time.sampler()
        else:
            self.max_turns = 1


class RequestPlanner:
    def __init__(self, profile: Profile, seed: int | None = None):
        self.profile = profile
        self.seed = profile.seed if seed is None else int(seed)
        self.load_kind = profile.load.kind
        self.plan = profile.load.plan
        trace = self.load_kind == "trace"
        self._trace_rows = self.plan.rows if trace else None
        self._classes = [_ClassDraw(c, trace) for c in profile.classes]
        weights = np.array([c.weight for c in profile.classes], float)
        self._p = weights / weights.sum()
        self._sessions = any(c.session for c in self._classes)
        self._block_bases = [0]
        self._arrival_cache: dict[int, np.ndarray] = {}
        self._blocks: OrderedDict = OrderedDict()

    # ---- stages ---------------------------------------------------------------------------
    def stages(self) -> list[StagePlan]:
        plan, kind = self.plan, self.load_kind
        if kind == "concurrency":
            return [StagePlan(i, kind, level, users=level, warmup_s=plan.warmup,
                              hold_s=plan.hold, duration_s=plan.warmup + plan.hold)
                    for i, level in enumerate(plan.levels)]
        if kind == "rate":
            burst = {"poisson": 1.0, "gamma": plan.burstiness, "constant": None}[plan.arrival]
            total = plan.warmup + plan.duration
            return [StagePlan(i, kind, rate, rate=rate, warmup_s=plan.warmup,
                              hold_s=plan.duration, duration_s=total,
                              max_in_flight=plan.max_in_flight, arrival=plan.arrival,
                              burstiness=burst, expected_requests=rate * total)
                    for i, rate in enumerate(plan.rates)]
        if kind == "ramp":
            return [StagePlan(i, kind, s.users, users=s.users, spawn_rate=s.spawn_rate,
                              hold_s=s.duration, duration_s=s.duration)
                    for i, s in enumerate(plan.stages)]
        rows = self._trace_rows
        span = rows[-1].arrival_s if rows else 0.0
        return [StagePlan(0, kind, None, hold_s=span, duration_s=span,
                          max_in_flight=plan.max_in_flight, arrival="trace",
                          time_scale=plan.time_scale, expected_requests=float(len(rows)))]

    # ---- closed loop ----------------------------------------------------------------------
    def sessions(self, worker_index: int = 0, worker_count: int = 1,
                 start_item: int = 0) -> Iterator[list[PlannedRequest]]:
        """This worker's items in order: each a list of one request or of a session's turns.

        Endless, except under a trace plan (one item per trace row).
        """
        _check_worker(worker_index, worker_count)
        first = start_item + (worker_index - start_item) % worker_count
        limit = len(self._trace_rows) if self._trace_rows is not None else math.inf
        item = first
        while item < limit:
            yield self.item(item)
            item += worker_count

    def requests(self, worker_index: int = 0, worker_count: int = 1) -> Iterator[PlannedRequest]:
        """The flattened sequence for one worker (closed loop: endless)."""
        for session in self.sessions(worker_index, worker_count):
            yield from session

    # ---- open loop ------------------------------------------------------------------------
    def arrivals(self, stage_index: int, worker_index: int = 0,
                 worker_count: int = 1) -> list[PlannedRequest]:
        """Requests of a rate or trace stage with ``arrival_s`` from the stage start."""
        return list(self.iter_arrivals(stage_index, worker_index, worker_count))

    def iter_arrivals(self, stage_index: int, worker_index: int = 0,
                      worker_count: int = 1) -> Iterator[PlannedRequest]:
        """``arrivals()`` one request at a time: the first few of a large stage cost little."""
        _check_worker(worker_index, worker_count)
        if self.load_kind not in ("rate", "trace"):
            raise ValueError(f"a {self.load_kind} plan is closed loop: use requests() or "
                             "sessions()")
        times = self.arrival_times(stage_index)
        base = self.stage_first_item(stage_index)
        first = (worker_index - base) % worker_count
        for j in range(first, len(times), worker_count):
            yield from self.item(base + j, float(times[j]))

    def arrival_times(self, stage_index: int) -> np.ndarray:
        """All arrival offsets (seconds from the stage start) of an open-loop or trace stage.

        A rate stage index past the plan's last rate repeats the rates: stage i runs
        ``rates[i % len(rates)]`` with arrivals of its own (seeded by i). A search probes the
        plan's rates in an order it picks as it goes, and a worker knows a stage only by its
        index, so the search names each probe by such an index (``loadgen.search_shape``)."""
        if self.load_kind == "trace":
            if stage_index != 0:
                raise IndexError("a trace plan has one stage (index 0)")
            return np.array([r.arrival_s for r in self._trace_rows])
        if stage_index < 0:
            raise IndexError(f"stage {stage_index} out of range (0 or more)")
        cached = self._arrival_cache.get(stage_index)
        if cached is None:
            plan = self.plan
            rng = np.random.default_rng(np.random.SeedSequence(
                self.seed, spawn_key=(_ARRIVALS, stage_index)))
            rate = plan.rates[stage_index % len(plan.rates)]
            cached = arrival_offsets(rng, rate, plan.warmup + plan.duration,
                                     plan.arrival, plan.burstiness)
            self._arrival_cache[stage_index] = cached
        return cached

    def stage_first_item(self, stage_index: int) -> int:
        if self.load_kind == "trace":
            return 0
        return sum(len(self.arrival_times(s)) for s in range(stage_index))

    # ---- items ----------------------------------------------------------------------------
    def item(self, k: int, arrival_s: float | None = None) -> list[PlannedRequest]:
        """Item ``k``: one request, or all turns of session ``k``, with global indices;
        ``arrival_s`` goes on turn 1 (later turns follow their answers)."""
        b, pos = divmod(k, BLOCK)
        items, starts, _ = self._block(b)
        cls_i, group, turns = items[pos]
        c = self._classes[cls_i]
        index = self._block_base(b) + starts[pos]
        session = k if c.session else None
        out = []
        for t, (prompt, output, think) in enumerate(turns, start=1):
            prefix = c.prefix_tokens if t == 1 else 0
            out.append(PlannedRequest(index + t - 1, c.name, prompt + prefix, output, group,
                                      session, t, think if t > 1 else 0.0,
                                      arrival_s if t == 1 else None, len(turns), prefix))
        return out

    def _block_base(self, b: int) -> int:
        """Global index of block b's first request: the turns of all earlier items."""
        if not self._sessions:
            return b * BLOCK
        while len(self._block_bases) <= b:
            prev = len(self._block_bases) - 1
            self._block_bases.append(self._block_bases[prev] + self._block(prev)[2])
        return self._block_bases[b]

    def _block(self, b: int):
        cached = self._blocks.get(b)
        if cached is None:
            items = self._draw_block(b)
            starts, total = [], 0
            for _, _, turns in items:
                starts.append(total)
                total += len(turns)
            cached = self._blocks[b] = (items, starts, total)
            if len(self._blocks) > 64:
                self._blocks.popitem(last=False)
        return cached

    def _draw_block(self, b: int) -> list[tuple[int, int | None, list[tuple[int, int, float]]]]:
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(_ITEMS, b)))
        n = len(self._classes)
        which = rng.choice(n, size=BLOCK, p=self._p) if n > 1 else np.zeros(BLOCK, int)
        drawn = []
        for ci, c in enumerate(self._classes):
            # Every class draws for the whole block (the stream stays the same whatever the
            # class mix), but only the positions that chose it become Python values.
            mine = np.flatnonzero(which == ci)
            shape = (BLOCK, c.max_turns)
            prompt = _rows(c.prompt(rng, shape), mine) if c.prompt else None
            output = _rows(c.output(rng, shape), mine) if c.output else None
            group = _rows(rng.integers(0, c.groups, size=BLOCK), mine) if c.groups else None
            if c.session:
                turns = _rows(np.clip(c.turns(rng, BLOCK), 1, c.max_turns), mine)
                think = _rows(c.think(rng, shape), mine)
            else:
                turns, think = None, None
            drawn.append((prompt, output, group, turns, think))
        items = []
        rows = self._trace_rows
        for pos, ci in enumerate(which.tolist()):
            prompt, output, group, turns, think = drawn[ci]
            if rows is not None:
                # Trace lengths replace the class's; positions past the last row are never used.
                row = rows[min(b * BLOCK + pos, len(rows) - 1)]
                seq = [(max(1, row.prompt_tokens), max(1, row.output_tokens), 0.0)]
            elif think is None:
                seq = [(prompt[pos][0], output[pos][0], 0.0)]
            else:
                seq = [(prompt[pos][t], output[pos][t], think[pos][t]) for t in range(turns[pos])]
            items.append((ci, None if group is None else group[pos], seq))
        return items


def _rows(values: np.ndarray, positions: np.ndarray) -> dict:
    """{position: that row of ``values`` as Python numbers} for the given block positions."""
    return dict(zip(positions.tolist(), values[positions].tolist()))


def arrival_offsets(rng: np.random.Generator, rate: float, duration_s: float, arrival: str,
                    burstiness: float | None = None) -> np.ndarray:
    """Send times in [0, duration_s) for one open-loop stage.

    constant: k / rate (the first at 0). poisson: gaps ~ Exponential(mean 1/rate). gamma: gaps ~
    Gamma(shape=b, scale=1/(rate*b)), mean 1/rate, coefficient of variation 1/sqrt(b) (b = 1 is
    Poisson). For poisson and gamma the first arrival is one gap after the stage start.
    """
    if arrival == "constant":
        count = math.ceil(duration_s * rate - 1e-9)
        times = np.arange(count) / rate
        return times[times < duration_s]
    chunk = max(64, int(rate * duration_s * 1.1) + 64)
    parts, total = [], 0.0
    while total < duration_s:
        if arrival == "poisson":
            gaps = rng.exponential(1.0 / rate, size=chunk)
        elif arrival == "gamma":
            gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=chunk)
        else:
            raise ValueError(f"unknown arrival process {arrival!r}")
        # In place, and cut with searchsorted (times are sorted): a large stage holds one array.
        times = np.cumsum(gaps, out=gaps)
        times += total
        parts.append(times)
        total = float(times[-1])
    times = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return times[:np.searchsorted(times, duration_s, side="left")]


def _check_worker(worker_index: int, worker_count: int) -> None:
    if worker_count < 1 or not 0 <= worker_index < worker_count:
        raise ValueError(f"worker_index {worker_index} must be in 0..{worker_count - 1}")
