"""CPU KV offload (vLLM's --kv-offloading-size): a CPU tier under the GPU prefix cache, loaded
over PCIe instead of recomputed. In virtual time: multi-turn chat whose histories outgrow the GPU
KV cache gains hits and TTFT with the tier, and gains nothing when they fit."""
from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest
from prometheus_client.parser import text_string_to_metric_families

import servelab.store as store_pkg
from servelab.analysis.views import install_views
from servelab.core.errors import ServelabError
from servelab.sim.engine.engine import Engine
from servelab.sim.engine.kv_offload import LOAD, STORE, CPUTier, host_link, offload_block_manager
from servelab.sim.engine.sequence import Sequence
from servelab.sim.engine.virtual import VirtualRequest, VirtualRunner
from servelab.sim.engine.virtual_users import UserTurn, VirtualUsers
from servelab.sim.server.metrics import EngineMetrics, MetricsExporter, SimCollector
from servelab.specs.engine_config import build_engine_config
from servelab.specs.serve_args import parse_serve_args

MODEL = "Qwen/Qwen2.5-7B-Instruct"
# An L4 at 0.8 of its memory keeps 45,840 KV tokens: 48 six-turn conversations (about 3,600
# tokens each by the last turn) do not fit, 8 do.
SMALL_GPU = ["--gpu-memory-utilization", "0.8"]
OFFLOAD = ["--kv-offloading-size", "16"]


def chat(args, users, seed=1):
    engine = Engine(build_engine_config("L4", MODEL, SMALL_GPU + args))
    model = VirtualUsers(VirtualRunner([engine]))
    rng = random.Random(seed)
    for u in range(users):
        turns = [UserTurn(VirtualRequest(rng.randint(300, 700), 60), think_s=rng.uniform(2, 8),
                          resend_history=True) for _ in range(6)]
        model.add_session(turns, u * 0.05)
    records = model.run().records
    assert len(records) == users * 6
    ttft = [r.chunk_times[0] - r.sent_s for r in records]
    return engine, sum(ttft) / len(ttft)


def hit_rate(engine):
    s = engine.stats
    cpu = engine.offload.hits if engine.offload else 0
    return (s.prefix_cache_hits_total + cpu) / s.prefix_cache_queries_total


def test_offload_pays_when_the_histories_outgrow_the_gpu():
    plain, plain_ttft = chat([], 48)
    tiered, tiered_ttft = chat(OFFLOAD, 48)
    tier = tiered.offload
    assert tiered.kv_plan.kv_tokens == plain.kv_plan.kv_tokens   # host memory, not GPU memory
    assert hit_rate(plain) < 0.1 and hit_rate(tiered) > 0.5 + hit_rate(plain)
    assert tiered_ttft < 0.5 * plain_ttft
    # Every hit from the tier was loaded over PCIe: hit tokens x KV bytes per token.
    per_token = tier.link.bytes_per_token
    assert tier.dirs[LOAD].bytes == pytest.approx(tier.hits * per_token)
    assert tier.dirs[STORE].bytes > 0 and tier.evictions == 0


def test_offload_changes_nothing_when_the_working_set_fits():
    plain, plain_ttft = chat([], 8)
    tiered, tiered_ttft = chat(OFFLOAD, 8)
    assert hit_rate(plain) > 0.6
    assert tiered.offload.hits == 0 and tiered.offload.dirs[LOAD].bytes == 0
    assert tiered_ttft == pytest.approx(plain_ttft)    # stores are asynchronous: no cost


def tier(blocks=2):
    config = build_engine_config("L4", MODEL, SMALL_GPU)
    return CPUTier(blocks, 16, host_link(config, 1000.0))


def test_a_store_is_found_only_once_it_has_landed_and_the_tier_evicts_lru():
    t = tier()
    t.store([1, 2], now=0.0)
    landed = t.ready_at[1]
    # 32 tokens x 1000 B over the L4's PCIe (32 GB/s, at the assumed 0.8) = 1.25 us
    assert landed == pytest.approx(32_000 / 25.6e9)
    assert t.lookup([1, 2], now=landed / 2) == 0 and t.lookup([1, 2], now=landed) == 2
    t.lookup([1], now=1.0)
    t.load([1], now=1.0)                   # a hit makes block 1 the most recent
    t.store([3], now=2.0)                  # full: the least recently used (2) goes
    assert list(t.ready_at) == [1, 3] and t.evictions == 1
    assert t.lookup([1, 2, 3], now=3.0) == 1   # consecutive blocks only


def test_the_flags_as_vllm_spells_them():
    config = build_engine_config("L4", MODEL, OFFLOAD)
    assert config.kv_offload_bytes == 16 * 2**30
    # The connector spelled out, as --kv-offloading-size expands it, is offloading, not PD.
    args = parse_serve_args(["--kv-transfer-config", '{"kv_connector":"OffloadingConnector",'
                             '"kv_role":"kv_both","kv_connector_extra_config":'
                             '{"cpu_bytes_to_use":1073741824}}'])
    assert args.kv_transfer_config is None and args.kv_offloading_size == 1.0
    engine = Engine(build_engine_config("L4", MODEL, ["--kv-transfer-config",
                                                      '{"kv_connector":"OffloadingConnector",'
                                                      '"kv_connector_extra_config":'
                                                      '{"num_cpu_blocks":500}}']))
    assert engine.offload.num_blocks == 500
    with pytest.raises(ServelabError, match="--kv-offloading-size: found '0'"):
        parse_serve_args(["--kv-offloading-size", "0"])
    with pytest.raises(ServelabError, match="cpu_bytes_to_use"):
        parse_serve_args(["--kv-transfer-config", '{"kv_connector":"OffloadingConnector"}'])


def test_metrics_and_server_timeline_show_the_tier(tmp_path):
    engine, _ = chat(OFFLOAD, 48)
    collector = SimCollector(MODEL, [engine], [EngineMetrics(8192)], {"block_size": "16"}, 0)
    text = MetricsExporter(collector).render().decode()
    samples = {(s.name, s.labels.get("transfer_type")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("vllm:external_prefix_cache_hits_total", None)] == engine.offload.hits
    assert samples[("vllm:kv_offload_total_bytes_total", LOAD)] == engine.offload.dirs[LOAD].bytes
    assert samples[("vllm:kv_offload_size_count", STORE)] == engine.offload.dirs[STORE].transfers
    assert 'kv_offloading_size="16.0"' in text and 'num_cpu_blocks="18724"' in text

    con = duckdb.connect(str(tmp_path / "db.duckdb"))
    con.execute((Path(store_pkg.__file__).parent / "schema.sql").read_text())
    rows = []
    for t, scale in ((1000.2, 0.0), (1001.2, 1.0)):   # a scrape before the traffic, one after
        for f in text_string_to_metric_families(text):
            for s in f.samples:
                if s.name.endswith("_total"):
                    rows.append(("r", t, s.name, s.labels, s.value * scale))
    con.executemany("INSERT INTO server_metrics VALUES (?, ?, ?, ?, ?)", rows)
    install_views(con)
    got = con.execute("SELECT offload_hit_rate, prefix_hit_rate_any_tier, offload_load_bytes, "
                      "offload_store_bytes FROM server_timeline WHERE t_unix = 1001").fetchone()
    tier = engine.offload
    assert got[0] == pytest.approx(tier.hits / tier.queries)
    assert got[1] == pytest.approx(hit_rate(engine))
    assert got[2:] == (pytest.approx(tier.dirs[LOAD].bytes), pytest.approx(tier.dirs[STORE].bytes))


LMCACHE = OFFLOAD + ["--kv-offloading-backend", "lmcache"]


def lmcache_connector(extra):
    return ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both",'
            '"kv_connector_extra_config":' + extra + '}']


def test_lmcache_hits_whole_chunks_saves_prompt_chunks_and_copies_inside_the_step():
    # --no-enable-prefix-caching, as LMCache's examples run it: every reuse comes from chunks.
    config = build_engine_config("L4", MODEL, SMALL_GPU + ["--no-enable-prefix-caching"]
                                 + lmcache_connector('{"lmcache.max_local_cpu_size":2}'))
    assert config.kv_offload_bytes == 2 * 2**30 and config.lmcache_chunk_size == 256
    bm = offload_block_manager(config, 45_840, 16)
    first = Sequence("a", list(range(700)), 50)
    assert bm.match_prefix(first)[1] == 0 and bm.allocate(first, 700, (), 0, 0)
    stall = bm.sync_stall_s([first], [700])
    tier = bm.tier
    # Two whole chunks of the prompt (512 tokens), not the 188-token tail, copied in the step.
    assert tier.counts["stored_tokens"] == 512 and stall == tier.link.transfer_s(512)
    first.num_computed_tokens = 700
    first.num_output_tokens = 40                    # decoding saves nothing (save_decode off)
    assert bm.sync_stall_s([first], [1]) == 0.0
    # The next request shares 600 tokens: native blocks would give 592, LMCache's chunks 512.
    bm.now = 1.0
    second = Sequence("b", list(range(600)) + [-1] * 300, 50)
    blocks, hit = bm.match_prefix(second)
    assert blocks == [] and hit == 512
    assert bm.allocate(second, 900 - hit, blocks, 0, hit)
    second.num_computed_tokens = hit                # as the scheduler admits it
    # The step waits for the load of the two chunks and the store of its one new whole chunk.
    assert bm.sync_stall_s([second], [900 - hit]) == pytest.approx(
        tier.link.transfer_s(512) + tier.link.transfer_s(256))
    assert tier.counts["hit_tokens"] == 512 and tier.counts["stored_tokens"] == 768


def test_lmcache_against_native_when_the_histories_outgrow_the_gpu(tmp_path):
    plain, plain_ttft = chat([], 48)
    native, native_ttft = chat(OFFLOAD, 48)
    lm, lm_ttft = chat(LMCACHE, 48)
    # Fewer hits than native (whole chunks, no decoded tokens), copies that stall the batch:
    # most of native's gain, not all of it.
    assert hit_rate(plain) + 0.5 < hit_rate(lm) < hit_rate(native)
    assert native_ttft < lm_ttft < 0.5 * plain_ttft
    counts = lm.offload.counts
    assert counts["stored_tokens"] % 256 == 0 and counts["hit_tokens"] >= lm.offload.hits
    collector = SimCollector(MODEL, [lm], [EngineMetrics(8192)], {"block_size": "16"}, 0)
    text = MetricsExporter(collector).render().decode()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["lmcache:num_hit_tokens_total"].value == counts["hit_tokens"]
    assert samples["vllm:external_prefix_cache_hits_total"].value == lm.offload.hits
    assert samples["vllm:cache_config_info"].labels["kv_offloading_backend"] == "lmcache"
    assert "vllm:kv_offload_total_bytes_total" not in samples    # OffloadingConnector's only


def test_lmcache_flags_as_vllm_and_lmcache_spell_them():
    # --kv-offloading-size is for all ranks; vLLM hands each TP rank its share.
    assert build_engine_config("L4", MODEL, LMCACHE).kv_offload_bytes == 16 * 2**30
    # The connector spelled out: LMCache's default 5 GiB on each of the two ranks.
    config = build_engine_config("H100", MODEL, ["--tensor-parallel-size", "2"]
                                 + lmcache_connector("{}"))
    assert config.kv_offload_backend == "lmcache" and config.kv_offload_bytes == 10 * 2**30
    with pytest.raises(ServelabError, match="lmcache.use_layerwise: found True"):
        parse_serve_args(lmcache_connector('{"lmcache.use_layerwise":true}'))
    with pytest.raises(ServelabError, match="chunk_size 100 is not a multiple of --block-size"):
        build_engine_config("L4", MODEL, lmcache_connector('{"lmcache.chunk_size":100}'))
    # A producer or consumer role is LMCache's disaggregated prefill, not a CPU tier.
    args = parse_serve_args(["--kv-transfer-config",
                             '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_producer"}'])
    assert args.lmcache is None and args.kv_transfer_config["kv_role"] == "kv_producer"
