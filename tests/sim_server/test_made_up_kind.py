"""A server kind is one package: a made-up one, written into tmp_path and found by the registry,
is served by the simulator (its start-up log and /metrics in its own words), verified, and read by
the server views, with no other file edited."""
from __future__ import annotations

import sys
import textwrap
import urllib.request

import duckdb
import pytest

from servelab.analysis.views import install_views
from servelab.orchestration.verify import verify
from servelab.sim.engine.kv_sizing import plan_kv_cache
from servelab.sim.engine.startup_log import dialect
from servelab.sim.server.server import resolve_config, start_background
from servelab.specs import server_kinds
from servelab.specs.variants import load_variant
from servelab.store.db import schema_sql

# vLLM's engine under another name: its log lines carry a prefix of their own and its /metrics
# names another prefix, so reading it back proves the kind's own grammar was used.
PACKAGE = '''
import dataclasses

from prometheus_client.metrics_core import Metric

from servelab.specs.server_kinds import VLLM, SimDialect
from servelab.specs.server_kinds.vllm import log as vllm_log
from servelab.specs.server_kinds.vllm import sim_log as vllm_sim_log

PREFIX = "[madeup] "


def format_line(line, now=None):
    return PREFIX + vllm_sim_log.format_line(line, now)


class Renamed:
    def __init__(self, sim):
        self.sim = sim

    def collect(self):
        for family in self.sim.collect():
            out = Metric(family.name.replace("vllm:", "madeup:"), family.documentation,
                         family.type)
            for s in family.samples:
                out.add_sample(s.name.replace("vllm:", "madeup:"), s.labels, s.value)
            yield out


KIND = dataclasses.replace(
    VLLM, name="madeup", label="MadeUp",
    metrics={k: v.replace("vllm:", "madeup:") for k, v in VLLM.metrics.items()},
    view_metrics={k: v.replace("vllm:", "madeup:") for k, v in VLLM.view_metrics.items()},
    parse_log=lambda text, facts: vllm_log.parse_log(text.replace(PREFIX, ""), facts),
    parse_metrics=lambda text, facts: vllm_log.parse_metrics(
        text.replace("madeup:", "vllm:"), facts),
    sim_log=SimDialect(vllm_sim_log.startup_lines, format_line, None),
    sim_metrics=Renamed)
'''


@pytest.fixture
def made_up_kind(tmp_path, monkeypatch):
    folder = tmp_path / "kinds" / "madeup"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PACKAGE)
    monkeypatch.setattr(server_kinds, "__path__", [*server_kinds.__path__, str(folder.parent)])
    try:
        found = server_kinds.find_kinds()
        monkeypatch.setitem(server_kinds.KINDS, "madeup", found["madeup"])
        yield found["madeup"]
    finally:
        sys.modules.pop("servelab.specs.server_kinds.madeup", None)


def test_a_made_up_kind_is_simulated_and_verified_with_no_other_edit(made_up_kind, tmp_path):
    assert list(server_kinds.find_kinds()) == ["vllm", "madeup", "sglang"]
    variant = tmp_path / "made_up.yaml"
    variant.write_text(textwrap.dedent("""\
        name: made_up
        description: vLLM's engine as a made-up server kind
        server: madeup
        model: Qwen/Qwen2.5-0.5B-Instruct
        serve_args: ["--max-model-len", "4096"]
        gpus: 1
        claims: {weights: bf16, activations: bf16, min_compute_capability: 8.0,
                 speculative: null}
        """))
    assert load_variant(variant, environ={}).kind is made_up_kind
    config, _, _ = resolve_config("H100", variant=str(variant))
    assert config.server_kind == "madeup"
    speaks = dialect(config)
    log = tmp_path / "sim.log"
    log.write_text("".join(speaks.format_line(line) + "\n"
                           for line in speaks.startup_lines(config, plan_kv_cache(config))))
    assert all(line.startswith("[madeup] ") for line in log.read_text().splitlines())
    with start_background(hardware="H100", variant=str(variant)) as bg:
        page = urllib.request.urlopen(bg.url + "/metrics", timeout=10).read().decode()
        assert made_up_kind.metrics["running"] in page and "vllm:" not in page
        verdict = verify(load_variant(variant, environ={}), log_path=log, url=bg.url)
    assert verdict.status == "verified", verdict.summary()
    assert verdict.facts["metrics_seen"] and verdict.facts["engine_config_seen"]


def test_the_server_views_read_a_made_up_kind_by_its_own_names(made_up_kind, tmp_path):
    con = duckdb.connect(str(tmp_path / "db.duckdb"))
    con.execute(schema_sql())
    running = made_up_kind.metrics["running"]
    con.execute("INSERT INTO server_metrics VALUES ('r', 1.5, ?, MAP {'engine': '0'}, 3.0), "
                "('r', 2.5, ?, MAP {'engine': '0'}, 4.0)", [running, running.replace(":", "_")])
    install_views(con)
    assert con.execute("SELECT exposed FROM server_metric_names WHERE kind = 'madeup' AND "
                       "canonical = 'running'").fetchall() == [(running,)]
    assert con.execute("SELECT metric, name, value FROM server_series ORDER BY t_unix"
                       ).fetchall() == [("running", running, 3.0), ("running", running, 4.0)]
