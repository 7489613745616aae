"""Prefill/decode disaggregation in virtual time: two engine pools, the KV transfer, the proxy.

A request goes as vLLM's NIXL proxy sends it (``specs.pd``): first to the prefill engine with
the fewest outstanding requests, with ``max_tokens`` 1. That engine's one token never reaches
the client (the proxy reads the non-streamed answer only for its ``kv_transfer_params``). When
it finishes, the proxy sends the original request to the least loaded decode engine, and the
decode engine reads the prompt's KV from the prefill engine (``kv_transfer.KVLink``: prompt
tokens x KV bytes per token over the link) before it can schedule the request. The decode
engine then holds every prompt token but the last, as vLLM's scheduler does with an external
KV hit (it recomputes one token to sample from), so its first step for the request is a decode
step; that step's token is the client's first. TTFT therefore includes the prefill queue and
step, the proxy's hops, the transfer and one decode step, and ITL is decode-only.

Each proxy hop costs ``ROUTER_HOP_S`` (an assumption: one more local HTTP request and response
through a Python proxy). Simplifications: the prefill engine frees the request's blocks when it
finishes (NIXL keeps them until the decode side has read them, which matters only when the
prefill pool's KV cache is full), and the whole prompt moves even where the decode engine has
a prefix of it cached (vLLM's NIXL reads only the uncached blocks).
"""
from __future__ import annotations

from dataclasses import replace

from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.engine import Engine, StepOutput
from servelab.sim.engine.kv_transfer import KVLink
from servelab.sim.engine.sequence import Sequence
from servelab.sim.engine.virtual import (
    FRONTEND_IN_S,
    FRONTEND_OUT_S,
    ClientRecord,
    InFlightCap,
    VirtualRequest,
    VirtualRunner,
    least_outstanding,
    prompt_ids_for,
)
from servelab.specs.cost_calibration import CostParams
from servelab.specs.engine_config import EngineConfig

ROUTER_HOP_S = 0.001  # one extra HTTP hop through the proxy (assumed; see the module docstring)


def handoff_s(link: KVLink, prompt_tokens: int, router_hop_s: float = ROUTER_HOP_S) -> float:
    """From the prefill step's end to the decode engine holding the prompt's KV: the prefill
    answer back to the proxy, the proxy's request to a decode instance, the KV read. Predict and
    the HTTP simulator (``sim.server.pd``) both wait exactly this long."""
    return FRONTEND_OUT_S + router_hop_s + link.transfer_s(prompt_tokens)


class RemoteKVBlockManager(BlockManager):
    """A decode engine's blocks: a request whose KV arrived from a prefill engine matches all its
    prompt but the last token, like vLLM's external (connector) hit; local prefix-cache hits are
    still taken for what they cover, and only local hits count in the prefix-cache counters."""

    def __init__(self, base: BlockManager):
        super().__init__(base.num_blocks, base.block_size, base.enable_caching, base.match_size)
        self.remote: set[str] = set()
        self._remote_share = 0

    def match_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        blocks, hit = super().match_prefix(seq)
        self._remote_share = 0
        # A preempted request lost the transferred blocks and recomputes locally, as in vLLM.
        if (seq.request_id in self.remote and seq.num_preemptions == 0
                and seq.num_prompt_tokens - 1 > hit):
            self._remote_share = seq.num_prompt_tokens - 1 - hit
            hit = seq.num_prompt_tokens - 1
        return blocks, hit

    def record_query(self, num_tokens: int, hit_tokens: int) -> None:
        # The scheduler records right after matching the same request.
        super().record_query(num_tokens, hit_tokens - self._remote_share)
        self._remote_share = 0


def make_pd_engines(config: EngineConfig, prefill: int, decode: int, seed: int = 0,
                    cost: CostParams | None = None) -> list[Engine]:
    """``prefill`` engines, then ``decode`` engines, indexed 0.. in that order (the order of the
    variant's instances and of the /metrics ``engine`` label)."""
    engines = [Engine(config, seed=seed, engine_index=i, cost=cost)
               for i in range(prefill + decode)]
    for engine in engines[prefill:]:
        # A hook in Engine (an external-KV count on add_request) would make this swap needless.
        engine.block_manager = RemoteKVBlockManager(engine.block_manager)
        engine.scheduler.block_manager = engine.block_manager
    return engines


class DisaggRunner(VirtualRunner):
    """``VirtualRunner`` with the engines split: ``engines[:prefill]`` prefill, the rest decode.
    Records, samples and caps work as for colocated engines; a record's ``engine_index`` is its
    decode engine and ``cached_tokens`` the prefill engine's prefix-cache hit."""

    def __init__(self, engines: list[Engine], prefill: int, link: KVLink,
                 sample_interval_s: float = 1.0, router_hop_s: float = ROUTER_HOP_S):
        if not 0 < prefill < len(engines):
            raise ValueError(f"prefill pool of {prefill} out of {len(engines)} engines: each "
                             f"pool needs at least one")
        # The client's request and every streamed chunk pass through the proxy.
        super().__init__(engines, sample_interval_s, FRONTEND_IN_S + router_hop_s,
                         FRONTEND_OUT_S + router_hop_s)
        self.prefill = prefill
        self.link = link
        self.router_hop_s = router_hop_s
        self._handoff: dict[str, tuple] = {}      # request id -> its request, waiting for decode
        self._prefill_cached: dict[str, int] = {}
        self._queue: dict[str, float] = {}
        self.transfers: list[tuple[str, int, float]] = []  # (request id, tokens, seconds)

    def _arrive(self, t: float, req: VirtualRequest, index: int, sent_s: float,
                scheduled_s: float | None, cap: InFlightCap | None) -> None:
        rid = req.request_id or f"req-{index}"
        if rid in self._handoff:
            self._to_decode(t, rid)
            return
        # The first leg: VirtualRunner's own arrival, on the prefill pool, with max_tokens 1.
        i = least_outstanding([e.num_outstanding for e in self.engines[:self.prefill]])
        ids = prompt_ids_for(req, index)
        max_tokens = req.max_tokens or req.output_len
        self.engines[i].add_request(rid, ids, 1, ignore_eos=True, arrival_time=t)
        self._handoff[rid] = (replace(req, request_id=rid), ids, max_tokens)
        self._admit(t, i, ClientRecord(rid, req.class_name, i, sent_s, len(ids), max_tokens,
                                       scheduled_s=scheduled_s), cap)

    def _to_decode(self, t: float, rid: str) -> None:
        req, ids, max_tokens = self._handoff.pop(rid)
        pool = self.engines[self.prefill:]
        j = self.prefill + least_outstanding([e.num_outstanding for e in pool])
        engine = self.engines[j]
        engine.block_manager.remote.add(rid)
        eos_after = None if req.ignore_eos else req.output_len
        engine.add_request(rid, ids, max_tokens, min_tokens=req.min_tokens,
                           ignore_eos=req.ignore_eos, eos_after=eos_after, arrival_time=t,
                           spec_acceptance=req.spec_acceptance)
        self._live[rid].engine_index = j
        if not self._busy[j]:
            self._start_step(j, t)

    def _step_done(self, t: float, i: int, out: StepOutput, snapshot: tuple) -> None:
        if i >= self.prefill:
            done = [(seq, self._live[seq.request_id]) for seq in out.finished]
            super()._step_done(t, i, out, snapshot)
            for seq, rec in done:
                rec.cached_tokens = self._prefill_cached.pop(seq.request_id, 0)
                rec.queue_s = self._queue.pop(seq.request_id, rec.queue_s)
                self.engines[i].block_manager.remote.discard(seq.request_id)
            return
        self._current[i] = snapshot
        for seq in out.finished:
            # Answer to the proxy, the proxy's request to the decode engine, then the KV read.
            rid = seq.request_id
            self._prefill_cached[rid] = max(0, seq.num_cached_tokens)
            self._queue[rid] = seq.first_scheduled_time - seq.arrival_time
            transfer = self.link.transfer_s(seq.num_prompt_tokens)
            self.transfers.append((rid, seq.num_prompt_tokens, transfer))
            req = self._handoff[rid][0]
            self._push(t + handoff_s(self.link, seq.num_prompt_tokens, self.router_hop_s),
                       "arrive", (req, -1, 0.0, None, None))
        if self.engines[i].has_unfinished():
            self._start_step(i, t)
        else:
            self._busy[i] = False
