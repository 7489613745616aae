"""Prefill/decode disaggregation in a variant file: the ``pd:`` block.

vLLM's disaggregated prefill runs separate ``vllm serve`` instances, each started with
``--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`` (identical on
both roles: NIXL decides per request who sends), behind a proxy that sends each request to a
prefill instance with ``max_tokens: 1`` and ``kv_transfer_params: {"do_remote_decode": true}``,
then sends it again, with the ``kv_transfer_params`` the prefill answer returned, to a decode
instance whose stream goes back to the client (vLLM's
``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, ``docs/features/
nixl_connector_usage.md``). The ``pd:`` block says how many of the variant's ``instances``
prefill and how many decode; instance ``i`` prefills when ``i < prefill``.

What an instance shows of its connector (its log's connector and NIXL lines, the
``--kv-transfer-config`` echo, NIXL's ``/metrics``) is read here too, into ``ConnectorFacts``, for
``orchestration.verify_pd``.

Only NixlConnector is accepted: P2pNcclConnector needs ``kv_producer``/``kv_consumer`` roles, a
ZMQ proxy with its own ports and buffer sizes, none of which servelab generates or models.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

PD_KEYS = ("prefill", "decode", "kv_link_gb_s")
KV_CONNECTORS = ("NixlConnector",)
KV_FLAG = "--kv-transfer-config"
NIXL_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class PDSpec:
    prefill: int                      # instances that prefill (the first ones)
    decode: int                       # instances that decode (the rest)
    kv_connector: str
    kv_link_gb_s: float | None = None  # one direction; None: the hardware file's interconnect

    def role(self, instance: int) -> str:
        return "prefill" if instance < self.prefill else "decode"

    def index_in_role(self, instance: int) -> int:
        return instance if instance < self.prefill else instance - self.prefill

    def to_record(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode,
                "kv_connector": self.kv_connector, "kv_link_gb_s": self.kv_link_gb_s}


# Connectors that move KV within one server (CPU offload tiers), not between a prefill and a
# decode instance: a variant may spell its offload tier this way without a `pd:` block.
OFFLOAD_CONNECTORS = ("OffloadingConnector", "LMCacheConnectorV1")


def _offload_connector(value: Any) -> bool:
    import json

    try:
        cfg = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return False
    return (isinstance(cfg, dict) and cfg.get("kv_connector") in OFFLOAD_CONNECTORS
            and cfg.get("kv_role", "kv_both") == "kv_both")


def check_pd(block: Any, args: dict, instances: Any, server: str,
             add: Callable[[tuple, Any, str], None]) -> PDSpec | None:
    """The ``pd:`` block against the rest of the variant; ``add(field, found, allowed)`` records
    each problem. Without a block, ``--kv-transfer-config`` is refused: a single server with a
    connector and no proxy would measure nothing PD does."""
    kv = args.get(KV_FLAG)
    if block is None:
        if kv is not None and not _offload_connector(kv):
            add(("serve_args",), KV_FLAG, f"a `pd:` block ({{prefill: 1, decode: 1}}) beside "
                f"{KV_FLAG}, or no {KV_FLAG}")
        return None
    if not isinstance(block, dict):
        add(("pd",), block, "a mapping such as {prefill: 1, decode: 1}")
        return None
    for key in block:
        if key not in PD_KEYS:
            add(("pd", key), key, "one of " + ", ".join(PD_KEYS))
    counts = {}
    for role in ROLES:
        value = block.get(role)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            add(("pd", role), value, f"a whole number >= 1 of {role} instances")
        counts[role] = value if isinstance(value, int) else 0
    link = block.get("kv_link_gb_s")
    if link is not None and (isinstance(link, bool) or not isinstance(link, (int, float))
                             or link <= 0):
        add(("pd", "kv_link_gb_s"), link, "null or GB/s in one direction, e.g. 50 for 400 Gb/s "
            "InfiniBand between nodes")
    if isinstance(instances, int) and instances != counts["prefill"] + counts["decode"]:
        add(("instances",), instances, f"{counts['prefill'] + counts['decode']} = pd.prefill + "
            f"pd.decode")
    if server != "vllm":
        add(("server",), server, "vllm: the pd block follows vLLM's NixlConnector and proxy "
            "(SGLang's PD mode is not modelled)")
    if args.get("--data-parallel-size") not in (None, "1"):
        add(("serve_args",), "--data-parallel-size", "none with pd: each role's instances are "
            "separate servers (raise pd.prefill or pd.decode instead)")
    connector = None
    if not isinstance(kv, str):
        add(("serve_args",), kv, f"{KV_FLAG} '{NIXL_CONFIG}' (both roles start with it)")
    else:
        try:
            config = json.loads(kv)
        except json.JSONDecodeError:
            config = None
        if not isinstance(config, dict):
            add(("serve_args",), kv, f"{KV_FLAG} followed by a JSON object: '{NIXL_CONFIG}'")
        else:
            connector = config.get("kv_connector")
            if connector not in KV_CONNECTORS:
                add(("serve_args",), connector, "kv_connector " + ", ".join(KV_CONNECTORS))
            if config.get("kv_role") != "kv_both":
                add(("serve_args",), config.get("kv_role"), "kv_role kv_both (NIXL's proxy picks "
                    "each request's sender; vLLM's guide starts both roles so)")
    if connector not in KV_CONNECTORS or not counts["prefill"] or not counts["decode"]:
        return None
    return PDSpec(counts["prefill"], counts["decode"], connector,
                  None if link is None else float(link))


# What a vLLM instance says about its KV connector, in vLLM's own words (written from its source:
# the connector factory, ``kv_connector/factory.py``; NixlConnector's scheduler and worker; the
# metrics of ``NixlPromMetrics``). The API server echoes ``--kv-transfer-config`` in its
# "non-default args" line as a ``KVTransferConfig(...)`` repr; the engine's config line does not
# print it. The factory logs once per side (the engine core's scheduler, each GPU worker).
_CREATED = re.compile(r"Creating v1 connector with name: (\w+) and engine_id: (\S+)")
_NIXL_INIT = re.compile(r"Initializing NIXL (wrapper|worker|Scheduler)\b")
_ECHO = re.compile(r"'kv_transfer_config': KVTransferConfig\((.*)")
NIXL_UNAVAILABLE = "NIXL is not available"
NIXL_METRIC = "vllm:nixl_"   # NixlPromMetrics' prefix: registered only where NIXL runs


def _echoed(body: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=('([^']*)'|None)", body)
    return None if m is None or m.group(1) == "None" else m.group(2)


@dataclass
class ConnectorFacts:
    """One instance's KV-connector evidence; empty where its log and /metrics said nothing."""
    created: list[str] = field(default_factory=list)     # connector classes the factory built
    engine_ids: list[str] = field(default_factory=list)
    kv_connector: str | None = None                      # from the --kv-transfer-config echo
    kv_role: str | None = None
    nixl_init: list[str] = field(default_factory=list)   # "wrapper", "worker", "Scheduler"
    nixl_unavailable: bool = False
    nixl_metrics: bool = False
    transfers: float | None = None          # vllm:nixl_xfer_time_seconds_count (the reader's)
    transfer_s: float | None = None         # its _sum
    transfer_bytes: float | None = None     # vllm:nixl_bytes_transferred_sum
    failed_transfers: float | None = None   # vllm:nixl_num_failed_transfers_total
    expired_reqs: float | None = None       # vllm:nixl_num_kv_expired_reqs_total (the sender's)

    def to_record(self) -> dict:
        return dict(self.__dict__)


def read_connector_log(text: str, facts: ConnectorFacts | None = None) -> ConnectorFacts:
    facts = facts or ConnectorFacts()
    for line in text.splitlines():
        if m := _CREATED.search(line):
            if m.group(1) not in facts.created:
                facts.created.append(m.group(1))
            if m.group(2) not in facts.engine_ids:
                facts.engine_ids.append(m.group(2))
        if (m := _NIXL_INIT.search(line)) and m.group(1) not in facts.nixl_init:
            facts.nixl_init.append(m.group(1))
        if m := _ECHO.search(line):
            facts.kv_connector = _echoed(m.group(1), "kv_connector")
            facts.kv_role = _echoed(m.group(1), "kv_role")
        if NIXL_UNAVAILABLE in line:
            facts.nixl_unavailable = True
    return facts


def read_connector_metrics(text: str, facts: ConnectorFacts | None = None) -> ConnectorFacts:
    """NIXL's transfer counters, summed over engines. Histograms count on the side that records
    the transfer: the decode instance reads the prefill's blocks, so its page holds them."""
    from prometheus_client.parser import text_string_to_metric_families

    facts = facts or ConnectorFacts()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(NIXL_METRIC):
                facts.nixl_metrics = True
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    if facts.nixl_metrics:
        facts.transfers = sums.get("vllm:nixl_xfer_time_seconds_count")
        facts.transfer_s = sums.get("vllm:nixl_xfer_time_seconds_sum")
        facts.transfer_bytes = sums.get("vllm:nixl_bytes_transferred_sum")
        facts.failed_transfers = sums.get("vllm:nixl_num_failed_transfers_total")
        facts.expired_reqs = sums.get("vllm:nixl_num_kv_expired_reqs_total")
    return facts
