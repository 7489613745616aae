"""Drive engines in virtual time: no sleeping, no sockets, the same Engine the HTTP server runs.

``VirtualRunner`` is the event loop: requests are submitted with the time they are sent, and
``run`` returns every request's client-side timeline (``ClientRecord``: sent, every chunk's time
and size, finish) and periodic samples of the engines' gauges and counters, which is what a
benchmark client and a /metrics scraper would have seen. Who sends what when (closed-loop users,
open-loop arrivals, sessions) is ``virtual_users``.

Client-side times add a small frontend latency on either side of the engine. Where the
coefficients price the API server's CPU, that work is a queueing stage instead
(``sim.engine.frontend``: a request is handed to the engine once the loop has served it, each
step's chunks leave once processed, and the engine starts a step only once the step before last
has been streamed), and the fixed latency keeps only the network hops.

An open loop can be capped like the load generator's ``max_in_flight``: requests submitted with
an ``InFlightCap`` wait, first come first served, while ``limit`` of them are in flight, and leave
when a finished one frees a slot. Each record keeps the time it was meant to go (``scheduled_s``)
and the time it went (``sent_s``); one that waits past its ``give_up_s`` is recorded in
``VirtualResult.dropped`` instead.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field

from servelab.sim.engine.balancer import least_outstanding
from servelab.sim.engine.engine import Engine, StepOutput
from servelab.sim.engine.frontend import APIServer
from servelab.sim.engine.kv_offload import LOAD, STORE

FRONTEND_IN_S = 0.002    # request sent -> engine sees it
FRONTEND_OUT_S = 0.0005  # step done -> client receives the chunk
# With the API server's CPU priced (``sim.engine.frontend``), the network and accept/write hops.
NETWORK_IN_S = 0.001
NETWORK_OUT_S = 0.0005
_SUFFIX_BASE = 1 << 40   # request-unique prompt ids live above every prefix-group id


@dataclass
class VirtualRequest:
    prompt_len: int
    output_len: int
    arrival_s: float = 0.0                  # when the client sends it (open loop)
    prefix_group: str | int | None = None   # requests of one group share their first prefix_len tokens
    prefix_len: int = 0
    prompt_token_ids: Seq[int] | None = None  # explicit ids win over prefix_group
    ignore_eos: bool = True                 # output_len exact (as benchmarks run with --ignore-eos)
    max_tokens: int | None = None           # default output_len; with ignore_eos=False, EOS at output_len
    min_tokens: int = 0
    spec_acceptance: float | None = None
    class_name: str = "default"
    request_id: str | None = None


@dataclass
class ClientRecord:
    """One request as its client saw it in virtual time (the server side keeps its own
    ``sim.server.stream.ServerRecord``)."""
    request_id: str
    class_name: str
    engine_index: int
    sent_s: float
    prompt_tokens: int
    max_tokens: int
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    num_preemptions: int = 0
    queue_s: float | None = None            # engine arrival -> first scheduled
    scheduled_s: float | None = None        # capped: when it was meant to go (sent_s >= it)

    @property
    def send_delay_s(self) -> float:
        """How long an in-flight cap held it back (0 when it went on time)."""
        return 0.0 if self.scheduled_s is None else self.sent_s - self.scheduled_s

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.sent_s

    @property
    def tpot(self) -> float | None:
        if self.end_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]


@dataclass
class DroppedRequest:
    """A capped request that was still waiting for a slot at its ``give_up_s``: never sent."""
    request_id: str
    class_name: str
    scheduled_s: float
    dropped_s: float


@dataclass
class InFlightCap:
    """At most ``limit`` of the requests submitted with this cap in flight at once (from sending
    to the client receiving the last chunk); the rest wait in ``waiting``, first come first
    served. One cap per group that shares a limit, e.g. one per open-loop stage."""
    limit: int
    in_flight: int = 0
    waiting: deque = field(default_factory=deque)

    def __post_init__(self):
        if self.limit < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.limit}")


@dataclass
class StatSample:
    t: float
    engine_index: int
    num_running: int
    num_waiting: int
    kv_usage: float
    num_preemptions_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    spec_num_drafts_total: int
    spec_num_draft_tokens_total: int
    spec_num_accepted_tokens_total: int
    # The CPU KV-offload tier (zero without one), as vLLM's OffloadingConnector counts it:
    # tokens asked of it and found after a GPU miss, bytes carried each way (all TP ranks).
    offload_queries_total: int = 0
    offload_hits_total: int = 0
    offload_load_bytes_total: float = 0.0
    offload_store_bytes_total: float = 0.0


@dataclass
class VirtualResult:
    records: list[ClientRecord]
    samples: list[StatSample]
    end_s: float                # the last event the client saw (or until_s)
    engines: list[Engine]
    dropped: list[DroppedRequest] = field(default_factory=list)

    def finished(self, start_s: float = 0.0, end_s: float | None = None) -> list[ClientRecord]:
        end = self.end_s if end_s is None else end_s
        return [r for r in self.records if r.end_s is not None and start_s <= r.end_s <= end]

    def output_throughput(self, start_s: float = 0.0, end_s: float | None = None) -> float:
        """Output tokens per second of the chunks received in [start_s, end_s); without end_s,
        up to and including the run's last chunk."""
        end = self.end_s if end_s is None else end_s
        inclusive = end_s is None
        tokens = 0
        for r in self.records:
            for t, n in zip(r.chunk_times, r.chunk_tokens):
                if start_s <= t and (t < end or (inclusive and t == end)):
                    tokens += n
        return tokens / (end - start_s) if end > start_s else 0.0


def prompt_ids_for(req: VirtualRequest, index: int) -> Seq[int]:
    """Token ids: a group's shared prefix (equal ids hash to equal blocks), then ids unique to the
    request so that nothing else is shared by accident."""
    if req.prompt_token_ids is not None:
        return req.prompt_token_ids
    shared = min(req.prefix_len, req.prompt_len) if req.prefix_group is not None else 0
    ids: list[int] = []
    if shared:
        base = (hash(("servelab-prefix", req.prefix_group)) & 0xFFFFFFF) * 1_000_000
        ids = list(range(base, base + shared))
    start = _SUFFIX_BASE + index * 1_000_000
    ids.extend(range(start, start + req.prompt_len - shared))
    return ids


class VirtualRunner:
    """Event loop over arrivals and engine steps. Each engine is busy for its step's duration;
    a request that arrives meanwhile waits for the next step, as in vLLM's busy loop."""

    def __init__(self, engines: list[Engine], sample_interval_s: float = 1.0,
                 frontend_in_s: float = FRONTEND_IN_S, frontend_out_s: float = FRONTEND_OUT_S):
        self.engines = engines
        self.sample_interval_s = sample_interval_s
        # One API server per engine (a DP deployment's shared API server is not modelled).
        self.api = [APIServer(e.cost.params) for e in engines]
        if any(a.enabled for a in self.api):
            frontend_in_s = min(frontend_in_s, NETWORK_IN_S)
            frontend_out_s = min(frontend_out_s, NETWORK_OUT_S)
        self.frontend_in_s = frontend_in_s
        self.frontend_out_s = frontend_out_s
        self._heap: list = []
        self._tick = itertools.count()
        self._busy = [False] * len(engines)
        self._live: dict[str, ClientRecord] = {}
        self._caps: dict[str, InFlightCap] = {}
        self.records: list[ClientRecord] = []
        self.samples: list[StatSample] = []
        # Called with each sampled virtual second (predict's progress bar); None: nothing.
        self.progress = None
        self.dropped: list[DroppedRequest] = []
        self._next_index = 0
        self.now = 0.0
        self._last_client_s = 0.0
        # Gauges as of each engine's last completed step: step() updates state at once, but that
        # state belongs to the step's end, as in vLLM where stats come with each step's output.
        self._current = [self._snapshot(e) for e in engines]
        self.on_finish: Callable[[ClientRecord, float], None] | None = None

    def submit(self, req: VirtualRequest, sent_s: float, cap: InFlightCap | None = None,
               give_up_s: float | None = None) -> str:
        """Send ``req`` at ``sent_s``; with a ``cap``, at the first moment after it when a slot
        is free, unless that is later than ``give_up_s``. Returns its request id."""
        index = self._next_index
        self._next_index += 1
        if cap is None:
            self._push(sent_s + self.frontend_in_s, "arrive", (req, index, sent_s, None, None))
        else:
            self._push(sent_s, "send", (req, index, sent_s, cap, give_up_s))
        return req.request_id or f"req-{index}"

    def _push(self, t: float, kind: str, payload) -> None:
        heapq.heappush(self._heap, (t, next(self._tick), kind, payload))

    def _send(self, t: float, req: VirtualRequest, index: int, scheduled_s: float,
              cap: InFlightCap, give_up_s: float | None) -> None:
        if cap.in_flight < cap.limit:
            cap.in_flight += 1
            self._push(t + self.frontend_in_s, "arrive", (req, index, t, scheduled_s, cap))
            return
        entry = (index, req, scheduled_s)  # the index first: unique, so removal compares little
        cap.waiting.append(entry)
        if give_up_s is not None:
            self._push(max(t, give_up_s), "give_up", (cap, entry))

    def _give_up(self, t: float, cap: InFlightCap, entry: tuple) -> None:
        try:
            cap.waiting.remove(entry)
        except ValueError:
            return  # a slot freed up in time
        index, req, scheduled_s = entry
        self.dropped.append(DroppedRequest(req.request_id or f"req-{index}", req.class_name,
                                           scheduled_s, t))

    def _release(self, cap: InFlightCap, t: float) -> None:
        cap.in_flight -= 1
        if cap.waiting:
            index, req, scheduled_s = cap.waiting.popleft()
            cap.in_flight += 1
            self._push(t + self.frontend_in_s, "arrive", (req, index, t, scheduled_s, cap))

    @staticmethod
    def _snapshot(e: Engine) -> tuple:
        s = e.stats
        tier = e.offload
        offload = ((tier.queries, tier.hits, tier.dirs[LOAD].bytes, tier.dirs[STORE].bytes)
                   if tier is not None else (0, 0, 0.0, 0.0))
        return (s.num_running, s.num_waiting, s.kv_usage, s.num_preemptions_total,
                s.prefix_cache_queries_total, s.prefix_cache_hits_total, s.prompt_tokens_total,
                s.generation_tokens_total, s.spec_num_drafts_total, s.spec_num_draft_tokens_total,
                s.spec_num_accepted_tokens_total, *offload)

    def _start_step(self, i: int, t: float) -> None:
        engine = self.engines[i]
        gate = self.api[i].gate()
        if gate > t:   # the API server has not streamed the step before last yet
            self._busy[i] = True
            self._push(gate, "start", (i,))
            return
        out = engine.step(t)
        if out.duration_s <= 0 and not out.events:
            self._busy[i] = False
            self.api[i].reset_gate()
            self._current[i] = self._snapshot(engine)
            return
        self._busy[i] = True
        self._push(t + out.duration_s, "step", (i, out, self._snapshot(engine)))

    def _arrive(self, t: float, req: VirtualRequest, index: int, sent_s: float,
                scheduled_s: float | None, cap: InFlightCap | None) -> None:
        i = least_outstanding([e.num_outstanding for e in self.engines])
        ids = prompt_ids_for(req, index)
        api = self.api[i]
        ready = api.request_in(t, len(ids))
        self._hand_off(t, api.last_job, (i, req, index, ids, sent_s, scheduled_s, cap), ready)

    def _hand_off(self, t: float, job, args: tuple, ready: float | None = None) -> None:
        """Into the engine once the API server's loop has served it, else looked at again then."""
        ready = self.api[args[0]].ready(job, t) if ready is None else ready
        if ready > t + 1e-9:
            self._push(ready, "enter", (job, args))
        else:
            self._enter(t, *args)

    def _enter(self, t: float, i: int, req: VirtualRequest, index: int, ids, sent_s: float,
               scheduled_s: float | None, cap: InFlightCap | None) -> None:
        rid = req.request_id or f"req-{index}"
        max_tokens = req.max_tokens or req.output_len
        eos_after = None if req.ignore_eos else req.output_len
        self.engines[i].add_request(rid, ids, max_tokens, min_tokens=req.min_tokens,
                                    ignore_eos=req.ignore_eos, eos_after=eos_after, arrival_time=t,
                                    spec_acceptance=req.spec_acceptance)
        self._admit(t, i, ClientRecord(rid, req.class_name, i, sent_s, len(ids), max_tokens,
                                       scheduled_s=scheduled_s), cap)
        # A request that waits for a busy engine shows up in the gauges at that step's end.

    def _admit(self, t: float, i: int, rec: ClientRecord, cap: InFlightCap | None) -> None:
        """Track a request just added to engine ``i``'s queue, and wake that engine if idle."""
        if cap is not None:
            self._caps[rec.request_id] = cap
        self._live[rec.request_id] = rec
        self.records.append(rec)
        if not self._busy[i]:
            self._start_step(i, t)

    def _step_done(self, t: float, i: int, out: StepOutput, snapshot: tuple) -> None:
        self._current[i] = snapshot
        client_t = self.api[i].step_out(t, len(out.events)) + self.frontend_out_s
        if out.events:
            self._last_client_s = client_t
        live = self._live
        for ev in out.events:
            rec = live[ev.request_id]
            if rec.first_token_s is None:
                rec.first_token_s = client_t
            rec.chunk_times.append(client_t)
            rec.chunk_tokens.append(ev.new_tokens)
            rec.output_tokens += ev.new_tokens
        for seq in out.finished:
            rec = live.pop(seq.request_id)
            rec.end_s = client_t
            rec.finish_reason = seq.finish_reason
            rec.cached_tokens = max(0, seq.num_cached_tokens)
            rec.num_preemptions = seq.num_preemptions
            rec.queue_s = seq.first_scheduled_time - seq.arrival_time
            cap = self._caps.pop(seq.request_id, None)
            if cap is not None:
                self._release(cap, client_t)
            if self.on_finish is not None:
                self.on_finish(rec, client_t)
        if self.engines[i].has_unfinished():
            self._start_step(i, t)
        else:
            self._busy[i] = False
            self.api[i].reset_gate()

    def _sample(self, t: float) -> None:
        for i in range(len(self.engines)):
            self.samples.append(StatSample(t, i, *self._current[i]))

    def run(self, until_s: float | None = None) -> VirtualResult:
        """Process events until none are left (or ``until_s``; in-flight work is then cut off)."""
        heap = self._heap
        next_sample = 0.0 if self.sample_interval_s > 0 else float("inf")
        while heap:
            t = heap[0][0]
            if until_s is not None and t > until_s:
                break
            while next_sample <= t:
                self._sample(next_sample)
                if self.progress is not None:
                    self.progress(next_sample)
                next_sample += self.sample_interval_s
            _, _, kind, payload = heapq.heappop(heap)
            self.now = t
            if kind == "step":
                self._step_done(t, *payload)
            elif kind == "arrive":
                self._arrive(t, *payload)
            elif kind == "enter":
                self._hand_off(t, *payload)
            elif kind == "start":
                self._start_step(payload[0], t)
            elif kind == "send":
                self._send(t, *payload)
            else:
                self._give_up(t, *payload)
        # Drained: the run ends when the client receives the last chunk, frontend_out_s after
        # the engine's last step.
        end = max(self.now, self._last_client_s) if until_s is None else max(self.now, until_s)
        while next_sample <= end:
            self._sample(next_sample)
            next_sample += self.sample_interval_s
        if self.sample_interval_s > 0 and (not self.samples or self.samples[-1].t < end):
            self._sample(end)  # the final state, off the regular grid
        return VirtualResult(self.records, self.samples, end, self.engines, self.dropped)
