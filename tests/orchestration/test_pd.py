"""Prefill/decode disaggregation: the variant format, the KV transfer's arithmetic against the
hardware files, the two-pool runner in virtual time, predict's matrix and the HTTP simulator's
two pools."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import yaml

from servelab.core.errors import ServelabError
from servelab.sim.engine.balancer import make_engines
from servelab.sim.engine.disagg import ROUTER_HOP_S, DisaggRunner, make_pd_engines
from servelab.sim.engine.kv_transfer import kv_link
from servelab.sim.engine.virtual import VirtualRequest, VirtualRunner
from servelab.sim.engine.virtual_users import UserTurn, VirtualUsers
from servelab.specs.engine_config import build_engine_config
from servelab.specs.variants import VariantError, load_variant

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def test_transfer_cost_follows_the_hardware_file_and_the_model():
    qwen = json.loads((REPO / "servers/models/Qwen--Qwen2.5-7B-Instruct/config.json").read_text())
    for hw, directions in (("H100", 2), ("L4", 1)):
        spec = yaml.safe_load((REPO / f"servers/hardware/{hw}.yaml").read_text())["interconnect"]
        config = build_engine_config(hw, QWEN, ["--max-model-len", "8192"])
        link = kv_link(config)
        assert link.kind == spec["type"]
        assert link.one_way_gb_s == spec["bandwidth_gb_s"] / directions
        # K and V of every layer, bf16: 28 layers x 4 KV heads x 128 x 2 x 2 bytes.
        assert link.bytes_per_token == 28 * 4 * 128 * 2 * 2 == 57344
        eff = link.params.efficiency[spec["type"]]
        expected = link.params.latency_s + 2000 * 57344 / (spec["bandwidth_gb_s"] / directions
                                                           * eff * 1e9)
        assert link.transfer_s(2000) == pytest.approx(expected, rel=1e-12)
    assert (qwen["num_hidden_layers"], qwen["num_key_value_heads"]) == (28, 4)
    h100 = kv_link(build_engine_config("H100", QWEN, []))
    l4 = kv_link(build_engine_config("L4", QWEN, []))
    assert l4.transfer_s(4000) > 10 * (h100.transfer_s(4000) - h100.params.latency_s)
    # A network between nodes replaces the hardware link; TP=2 moves half per GPU, side by side.
    net = kv_link(build_engine_config("H100", QWEN, []), link_gb_s=50)
    assert (net.kind, net.one_way_gb_s) == ("network", 50.0)
    tp2 = kv_link(build_engine_config("H100", QWEN, ["--tensor-parallel-size", "2"]))
    assert tp2.bytes_per_token == h100.bytes_per_token / 2


def _arrivals():
    """Long decodes that run throughout, with a long prompt arriving every 0.25 s."""
    reqs = [VirtualRequest(200, 400, arrival_s=0.01 * i, request_id=f"d{i}") for i in range(8)]
    reqs += [VirtualRequest(6000, 8, arrival_s=0.1 + 0.25 * i, request_id=f"p{i}")
             for i in range(8)]
    return reqs


def _run(runner):
    users = VirtualUsers(runner)
    for r in _arrivals():
        users.add_session([UserTurn(r)], r.arrival_s)
    return {r.request_id: r for r in users.run().records}


def test_pd_decode_itl_has_no_prefill_stalls_that_colocated_serving_shows():
    config = build_engine_config("H100", QWEN, ["--max-model-len", "8192"])
    link = kv_link(config)
    pd_runner = DisaggRunner(make_pd_engines(config, 1, 1), 1, link, sample_interval_s=0)
    pd = _run(pd_runner)
    colocated = _run(VirtualRunner(make_engines(config, count=2), sample_interval_s=0))
    for recs in (pd, colocated):
        assert all(r.end_s is not None for r in recs.values())
        assert all(recs[f"d{i}"].output_tokens == 400 for i in range(8))
    worst = {name: max(max(recs[f"d{i}"].itls) for i in range(8))
             for name, recs in (("pd", pd), ("colocated", colocated))}
    typical = sorted(x for i in range(8) for x in pd[f"d{i}"].itls)[len(pd["d0"].itls) * 4]
    # A 6,000-token prefill step lands between two decode steps when they share an engine.
    assert worst["colocated"] > 5 * typical
    assert worst["pd"] < 1.5 * typical
    # Every request crossed the link once, and decoded on the decode engine (index 1), whose
    # prefix-cache counters do not count the transferred prompt as a local hit.
    assert len(pd_runner.transfers) == 16 and {r.engine_index for r in pd.values()} == {1}
    assert pd_runner.engines[1].stats.prefix_cache_hits_total == 0
    # TTFT holds the prefill, both proxy hops and the transfer: longer than colocated alone.
    p0 = pd["p0"]
    assert p0.ttft > link.transfer_s(6000) + 2 * ROUTER_HOP_S
    assert p0.ttft > colocated["p0"].ttft


def test_predict_matrix_compares_pd_with_dp2(tmp_path, cli):
    code, out, err = cli("matrix", "--variants", "pd_1p1d,dp2", "--profile",
                         DATA / "tiny.yaml", "--backend", "predict", "--hardware", "L4",
                         "--db", tmp_path / "p.duckdb", "--out", tmp_path / "r", "--no-report")
    assert code == 0, err
    assert (tmp_path / "r" / "matrix.md").read_text().count("| predicted | predicted |") == 2
    con = duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True)
    settings = json.loads(con.execute("SELECT settings FROM runs WHERE variant = 'pd_1p1d'")
                          .fetchone()[0])
    con.close()
    transfer = settings["kv_transfer"]
    assert (transfer["link"], transfer["one_way_gb_s"], transfer["assumed"]) == ("pcie", 32, True)
    assert transfer["transfers"] > 0 and settings["variant"]["pd"]["decode"] == 1


def test_a_pd_block_is_checked_against_the_rest_of_the_file(tmp_path):
    path = tmp_path / "pd_bad.yaml"
    text = (REPO / "servers/variants/pd_1p1d.yaml").read_text().replace(
        "name: pd_1p1d", "name: pd_bad").replace("pd: {prefill: 1, decode: 1}",
                                                 "pd: {prefill: 2, decode: 1, extra: 1}")
    path.write_text(text.replace('"kv_role":"kv_both"', '"kv_role":"kv_producer"'))
    with pytest.raises(VariantError) as exc:
        load_variant(path)
    message = str(exc.value)
    for needle in ("pd.extra", "instances: found 2; allowed 3 = pd.prefill",
                   "kv_role kv_both"):
        assert needle in message, message
    # A connector without a pd block would serve as one plain server.
    plain = tmp_path / "kv_only.yaml"
    plain.write_text(text.replace("name: pd_bad", "name: kv_only")
                     .replace("pd: {prefill: 2, decode: 1, extra: 1}\n", ""))
    with pytest.raises(VariantError, match="a `pd:` block"):
        load_variant(plain)


def test_the_http_simulator_serves_a_pd_variant_as_two_pools_behind_its_proxy():
    """The variant's split reaches the simulator (tests/sim_server/test_sim_pd.py serves it);
    a connector flag without a variant's pd block is still refused, naming the block."""
    from servelab.sim.server.server import build_server, resolve_config

    config, pd, _ = resolve_config("H100", variant="pd_1p1d")
    assert (pd.prefill, pd.decode, pd.kv_connector) == (1, 1, "NixlConnector")
    server = build_server("H100", variant="pd_1p1d")
    assert [i.name for i in server.pd.instances] == ["prefill-0", "decode-0"]
    assert server.pd.decode[0].engine.block_manager.remote == set()
    with pytest.raises(ServelabError, match="instances"):
        resolve_config("H100", variant="pd_1p1d", instances=3)
    with pytest.raises(ServelabError, match="a variant with a `pd:` block"):
        resolve_config("H100", QWEN, ["--kv-transfer-config", '{"kv_connector":"NixlConnector",'
                                                              '"kv_role":"kv_both"}'])
