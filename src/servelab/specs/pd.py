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

Only NixlConnector is accepted: P2pNcclConnector needs ``kv_producer``/``kv_consumer`` roles, a
ZMQ proxy with its own ports and buffer sizes, none of which servelab generates or models.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
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


def check_pd(block: Any, args: dict, instances: Any, server: str,
             add: Callable[[tuple, Any, str], None]) -> PDSpec | None:
    """The ``pd:`` block against the rest of the variant; ``add(field, found, allowed)`` records
    each problem. Without a block, ``--kv-transfer-config`` is refused: a single server with a
    connector and no proxy would measure nothing PD does."""
    kv = args.get(KV_FLAG)
    if block is None:
        if kv is not None:
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
