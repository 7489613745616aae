"""A CPU tier under the GPU prefix cache: vLLM's native KV offloading (``--kv-offloading-size``).

What vLLM 0.26 does, and what is modelled here (sources: ``vllm/config/vllm.py``, which turns
``--kv-offloading-size GiB --kv-offloading-backend native`` into the ``OffloadingConnector`` with
``cpu_bytes_to_use = size x 2^30`` for all TP ranks together; the connector's scheduler side,
``kv_connector/v1/offloading/scheduler.py``; the CPU manager's LRU policy, ``kv_offload/cpu``):

- **Stores are write-through and asynchronous.** Every block that becomes full is copied GPU ->
  CPU on a separate CUDA stream as soon as the step that computed it ends (``_get_reqs_to_store``),
  whether or not the GPU will evict it; a block already in the tier is not copied again. A copy
  is usable only once it has landed (``complete_store``): here, when the device-to-host
  direction of the PCIe link has carried it, one block after another.
- **The tier is an LRU of blocks** keyed by the same chained block hash as the GPU cache, of
  ``cpu bytes / (block_size x KV bytes per token x TP)`` blocks; a full tier evicts its least
  recently used block to store a new one. A hit or a repeated store makes a block most recent.
- **Loads replace recompute.** When a waiting request's GPU prefix hit ends, the tier is asked
  for the blocks that follow (consecutive, ready ones; the last prompt token is always computed).
  The request gets GPU blocks for them and waits (vLLM's WAITING_FOR_REMOTE_KVS) while the
  host-to-device direction carries them; it is scheduled in the first step that starts after the
  load landed, with those tokens counted as computed. Other requests keep running meanwhile.

Assumptions (docs/simulator.md, "CPU KV offload"): the host link's bandwidth is the hardware
file's PCIe figure where the GPUs are PCIe-linked, else PCIe Gen5 x16 (64 GB/s) on Hopper and
Gen4 x16 (32 GB/s) before it, at ``EFFICIENCY`` of it (pinned-memory DMA); the copies do not slow
the forward passes (DMA engines, not SMs); each TP rank moves its share over its own link, side
by side. ``servelab calibrate`` would fit the efficiency from a real server's
``vllm:kv_offload_total_time`` against ``vllm:kv_offload_total_bytes``.

LMCache (``LMCacheTier``, ``LMCacheBlockManager``; vLLM's in-tree
``kv_connector/v1/lmcache_integration/vllm_v1_adapter.py`` and LMCache's ``lmcache/v1/config.py``)
differs where it changes latency:

- **256-token chunks.** Its store is keyed by chunk (``chunk_size``, default 256), and a lookup
  counts leading whole chunks of the prompt only; the GPU prefix cache still hits by block first,
  and the connector adds what lies beyond it (``get_num_new_matched_tokens``: LMCache hit minus
  vLLM's computed tokens, one less when the whole prompt hit). A retrieve starts at the chunk
  boundary at or below the GPU hit, so the part of a chunk already on the GPU is copied again.
- **Its save policy.** Only the prompt's whole chunks are saved (``save_decode_cache`` false,
  ``save_unfull_chunk`` false by default), each chunk once, as the prefill reaches it: a reply's
  tokens reach the store only when the next turn resends them as prompt. Native vLLM copies every
  full block, decoded ones included.
- **Copies block the step.** Without layerwise pipelining or async loading (both off by default),
  ``start_load_kv`` retrieves before the forward pass and ``wait_for_save`` stores after it, so
  the whole batch waits for both (``sync_stall_s``); native copies run beside the steps.
- **Its size is per TP rank** (``max_local_cpu_size`` GiB, default 5.0, x 2^30); vLLM's
  ``--kv-offloading-backend lmcache`` passes ``--kv-offloading-size / (TP x PP)`` to each rank.
  Eviction is LRU by chunk (``cache_policy`` LRU). The link and its efficiency are the native
  tier's (the same assumption: LMCache's gather kernel plus pinned DMA at ``EFFICIENCY``).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.kv_sizing import kv_bytes_per_token
from servelab.sim.engine.kv_transfer import KVLink, KVTransferParams
from servelab.sim.engine.sequence import Sequence

EFFICIENCY = 0.8          # achieved / spec PCIe bandwidth for pinned host copies (assumption)
HOPPER_PCIE_GB_S = 64.0   # PCIe Gen5 x16, one direction
AMPERE_PCIE_GB_S = 32.0   # PCIe Gen4 x16, one direction
LOAD, STORE = "CPU_to_GPU", "GPU_to_CPU"   # vLLM's transfer_type label values
# vLLM's vllm:kv_offload_size buckets (bytes per transfer).
SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)


def host_link(config, kv_bytes_per_token: float) -> KVLink:
    """The GPU <-> host link one TP rank's copies use (see the module docstring)."""
    hw = config.hardware
    if hw.link_type == "pcie":
        gb_s = hw.link_bandwidth_gb_s
    else:
        gb_s = HOPPER_PCIE_GB_S if hw.compute_capability[0] >= 9 else AMPERE_PCIE_GB_S
    return KVLink("pcie", gb_s, KVTransferParams(efficiency={"pcie": EFFICIENCY}, latency_s=0.0),
                  kv_bytes_per_token)


@dataclass
class Direction:
    """One direction of the host link: when it is next free and what it has carried."""
    free_at: float = 0.0
    bytes: float = 0.0      # all TP ranks together, as vLLM sums its workers' transfers
    time_s: float = 0.0     # one rank's copy time (the ranks copy side by side)
    transfers: int = 0

    def __post_init__(self):
        self.size_counts = [0] * (len(SIZE_BUCKETS) + 1)
        self.size_sum = 0.0


class CPUTier:
    def __init__(self, num_blocks: int, block_size: int, link: KVLink, tp: int = 1):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.link = link
        self.tp = tp
        self.ready_at: OrderedDict[int, float] = OrderedDict()   # hash -> copy landed; LRU order
        self.dirs = {LOAD: Direction(), STORE: Direction()}
        self.evictions = 0
        self.queries = 0     # tokens, as vllm:external_prefix_cache_queries counts them
        self.hits = 0

    @property
    def usage(self) -> float:
        return len(self.ready_at) / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes, now: float) -> int:
        """Leading blocks of ``hashes`` held and landed by ``now``."""
        n = 0
        ready = self.ready_at
        for h in hashes:
            t = ready.get(h)
            if t is None or t > now:
                break
            n += 1
        return n

    def _carry(self, kind: str, blocks: int, now: float) -> float:
        d = self.dirs[kind]
        tokens = blocks * self.block_size
        dt = self.link.transfer_s(tokens)
        done = max(now, d.free_at) + dt
        d.free_at = done
        size = self.link.transfer_bytes(tokens) * self.tp
        d.bytes += size
        d.time_s += dt
        d.transfers += 1
        d.size_sum += size
        i = 0
        while i < len(SIZE_BUCKETS) and size > SIZE_BUCKETS[i]:
            i += 1
        d.size_counts[i] += 1
        return done

    def load(self, hashes, now: float) -> float:
        """Copy these (held) blocks to the GPU; returns when the copy lands."""
        for h in hashes:
            self.ready_at.move_to_end(h)
        return self._carry(LOAD, len(hashes), now)

    def store(self, hashes, now: float) -> None:
        """Write-through of newly full blocks: new ones are copied (evicting LRU blocks to make
        room), ones already held only become most recent."""
        new = []
        ready = self.ready_at
        for h in hashes:
            if h in ready:
                ready.move_to_end(h)
            elif self.num_blocks:
                new.append(h)
        if not new:
            return
        new = new[-self.num_blocks:]
        done = self._carry(STORE, len(new), now)
        for h in new:
            if len(ready) >= self.num_blocks:
                ready.popitem(last=False)
                self.evictions += 1
            ready[h] = done

    def clear(self) -> None:
        self.ready_at.clear()


class OffloadingBlockManager(BlockManager):
    """The GPU block manager with a ``CPUTier`` under its prefix cache. ``now`` is the step's
    start while the scheduler admits (lookups and loads) and its end while the engine commits
    the step's blocks (stores); the scheduler holds loading requests out of the batch
    (``take_loads``)."""

    def __init__(self, num_blocks: int, block_size: int, tier: CPUTier):
        super().__init__(num_blocks, block_size, True)
        self.tier = tier
        self._matched: dict[str, tuple[int, int]] = {}   # request -> (GPU blocks, CPU blocks)
        self.loads: dict[str, float] = {}                # admitted this step -> load landed at
        self._last_loaded = 0   # tokens the last successful allocate loads from the tier

    def match_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        blocks, hit = super().match_prefix(seq)
        start = len(blocks)
        limit = (seq.num_tokens - 1) // self.block_size
        cpu = 0
        if limit > start:
            hashes = self._hash_upto(seq, limit)
            cpu = self.tier.lookup(hashes[start:limit], self.now)
        self._matched[seq.request_id] = (start, cpu)
        return blocks, hit + cpu * self.block_size

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks=(), num_lookahead: int = 0,
                 num_cached_tokens: int | None = None) -> bool:
        if not super().allocate(seq, num_new_tokens, cached_blocks, num_lookahead,
                                num_cached_tokens):
            return False
        start, cpu = self._matched.pop(seq.request_id, (0, 0))
        self._last_loaded = 0
        if cpu and num_cached_tokens == (start + cpu) * self.block_size:
            self.loads[seq.request_id] = self.tier.load(seq.block_hashes[start:start + cpu],
                                                        self.now)
            self._last_loaded = cpu * self.block_size
        return True

    def record_query(self, num_tokens: int, hit_tokens: int) -> None:
        # The scheduler calls this right after the admission's allocate: the part of the hit
        # that allocate loads from the tier is vLLM's external (connector) hit, not a GPU one.
        loaded, self._last_loaded = self._last_loaded, 0
        super().record_query(num_tokens, hit_tokens - loaded)
        self.tier.queries += num_tokens
        self.tier.hits += loaded

    def commit(self, seq: Sequence) -> None:
        done = seq.num_committed_blocks
        super().commit(seq)
        full = seq.num_committed_blocks
        if full > done:
            self.tier.store(seq.block_hashes[done:full], self.now)

    def reset_prefix_cache(self) -> bool:
        if not super().reset_prefix_cache():
            return False
        self.tier.clear()
        return True

    def take_loads(self) -> dict[str, float]:
        loads, self.loads = self.loads, {}
        return loads


def offload_block_manager(config, kv_tokens: int, block_size: int) -> OffloadingBlockManager:
    """The block manager of an offloading engine: native vLLM's tier or LMCache's."""
    per_token = kv_bytes_per_token(config)
    tp = config.tensor_parallel_size
    link = host_link(config, per_token)
    if config.kv_offload_backend == "lmcache":
        chunk = config.lmcache_chunk_size
        tier = LMCacheTier(int(config.kv_offload_bytes // (chunk * per_token * tp)), chunk, link,
                           tp, config.lmcache_save_decode)
        return LMCacheBlockManager(kv_tokens // block_size, block_size, tier,
                                   config.enable_prefix_caching)
    cpu_blocks = config.kv_offload_num_cpu_blocks or int(
        config.kv_offload_bytes // (block_size * per_token * tp))
    return OffloadingBlockManager(kv_tokens // block_size, block_size,
                                  CPUTier(cpu_blocks, block_size, link, tp))


# LMCache's own counters (lmcache/observability.py), as LMCache counts them in the simulator:
# lookups of admitted requests and their prompt tokens / hit tokens, retrieves and the tokens
# they copy, stores and the tokens they copy, and vLLM's GPU hit of the requests it retrieved for.
LMCACHE_COUNTERS = ("lookup_requests", "lookup_tokens", "lookup_hits", "retrieve_requests",
                    "requested_tokens", "hit_tokens", "store_requests", "stored_tokens",
                    "vllm_hit_tokens")


class LMCacheTier(CPUTier):
    """LMCache's local CPU backend: an LRU of ``chunk``-token chunks (``block_size`` here is the
    chunk) keyed by the chained hash of the chunk's last vLLM block, so a key names its whole
    prefix as LMCache's prefix hash does. Copies are synchronous (see ``LMCacheBlockManager``)."""

    def __init__(self, num_chunks: int, chunk: int, link: KVLink, tp: int = 1,
                 save_decode: bool = False):
        super().__init__(num_chunks, chunk, link, tp)
        self.save_decode = save_decode
        self.counts = dict.fromkeys(LMCACHE_COUNTERS, 0)

    def retrieve(self, keys, now: float) -> float:
        """Copy these held chunks to the GPU; the seconds the step waits for the copy."""
        self.load(keys, now)
        tokens = len(keys) * self.block_size
        self.counts["retrieve_requests"] += 1
        self.counts["requested_tokens"] += tokens
        self.counts["hit_tokens"] += tokens
        return self.link.transfer_s(tokens)

    def put(self, keys, now: float) -> float:
        """Store the chunks not yet held (held ones become most recent); the seconds the step
        waits for the copy."""
        new = sum(1 for k in keys if k not in self.ready_at) if self.num_blocks else 0
        self.store(keys, now)
        if not new:
            return 0.0
        tokens = min(new, self.num_blocks) * self.block_size
        self.counts["store_requests"] += 1
        self.counts["stored_tokens"] += tokens
        return self.link.transfer_s(tokens)


class LMCacheBlockManager(OffloadingBlockManager):
    """The GPU block manager with LMCacheConnectorV1 beside it (module docstring): chunk-granular
    hits, prompt-only chunk saves, and copies the engine adds to the step (``sync_stall_s``).
    ``gpu_caching`` False is ``--no-enable-prefix-caching``, common with LMCache: the GPU cache
    never hits, every reuse comes from the chunks."""

    def __init__(self, num_blocks: int, block_size: int, tier: LMCacheTier,
                 gpu_caching: bool = True):
        if tier.block_size % block_size:
            raise ValueError(f"LMCache chunk {tier.block_size} is not a multiple of the "
                             f"{block_size}-token block")
        super().__init__(num_blocks, block_size, tier)
        self.gpu_caching = gpu_caching
        self.per_chunk = tier.block_size // block_size
        self._saved: dict[str, int] = {}   # request -> tokens LMCache holds for it (tracker)
        self._stall = 0.0                  # retrieve seconds of this step's admissions

    def lookup_prefix(self, seq: Sequence) -> list[int]:
        return super().lookup_prefix(seq) if self.gpu_caching else []

    def _chunk_keys(self, seq: Sequence, n: int) -> list[int]:
        hashes = self._hash_upto(seq, n * self.per_chunk)
        return hashes[self.per_chunk - 1:n * self.per_chunk:self.per_chunk]

    def match_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        blocks, gpu = BlockManager.match_prefix(self, seq)
        chunk = self.tier.block_size
        found = self.tier.lookup(self._chunk_keys(seq, seq.num_prompt_tokens // chunk),
                                 self.now) * chunk
        hit = found - 1 if found == seq.num_tokens else found
        self._matched[seq.request_id] = (gpu, found)
        return blocks, max(gpu, hit)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks=(), num_lookahead: int = 0,
                 num_cached_tokens: int | None = None) -> bool:
        if not BlockManager.allocate(self, seq, num_new_tokens, cached_blocks, num_lookahead,
                                     num_cached_tokens):
            return False
        self._last_loaded = 0
        if num_cached_tokens is None:
            return True     # a running request's new blocks: no lookup
        gpu, found = self._matched.pop(seq.request_id, (0, 0))
        counts = self.tier.counts
        counts["lookup_requests"] += 1
        counts["lookup_tokens"] += seq.num_prompt_tokens
        counts["lookup_hits"] += found
        self._saved[seq.request_id] = found
        if num_cached_tokens > gpu:
            chunk = self.tier.block_size
            first = gpu // chunk    # the retrieve starts at the chunk boundary below the GPU hit
            self._stall += self.tier.retrieve(self._chunk_keys(seq, found // chunk)[first:],
                                              self.now)
            counts["vllm_hit_tokens"] += gpu
            self._last_loaded = num_cached_tokens - gpu
        return True

    def commit(self, seq: Sequence) -> None:
        BlockManager.commit(self, seq)   # no write-through: LMCache saves in sync_stall_s

    def sync_stall_s(self, seqs, counts) -> float:
        """The seconds this step waits on LMCache: the retrieves its admissions started, and the
        chunks its prefill reaches, saved as ``ReqMeta.from_request_tracker`` decides."""
        stall, self._stall = self._stall, 0.0
        tier = self.tier
        chunk = tier.block_size
        for seq, n in zip(seqs, counts):
            saved = self._saved.get(seq.request_id, 0)
            upto = min(seq.num_computed_tokens + n, seq.num_tokens)
            if upto > seq.num_prompt_tokens and not tier.save_decode:
                continue                      # decoding: is_decode_phase without save_decode
            if saved and upto < (saved // chunk + 1) * chunk:
                continue                      # no new chunk boundary reached
            end = upto // chunk
            if end * chunk <= saved:
                continue
            self._saved[seq.request_id] = end * chunk
            stall += tier.put(self._chunk_keys(seq, end)[saved // chunk:], self.now)
        return stall

    def free_seq(self, seq: Sequence) -> None:
        self._saved.pop(seq.request_id, None)
        super().free_seq(seq)
