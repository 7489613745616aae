"""What moving one request's KV cache from a prefill to a decode instance costs.

time = fixed latency + prompt tokens x KV bytes per token / (link GB/s in one direction x
efficiency). The bytes per token are the engine's own (``kv_sizing.kv_bytes_per_token``: every
layer's K and V at the KV dtype, per GPU of a TP group, so a TP=2 pair moves half each, in
parallel). The link is the hardware file's ``interconnect`` (``bandwidth_gb_s``: NVLink's figure
counts both directions of all links, 900 on an H100 = 450 each way; PCIe's is one direction
already) unless the variant's ``pd.kv_link_gb_s`` names another (a network between nodes).

The efficiencies and the latency are assumptions, not measurements (docs/variants.md says how a
calibration would fit them): NIXL over UCX's cuda_ipc reaches most of a direction's NVLink
bandwidth on large block lists; PCIe peer copies on hosts without NVLink (g6's L4s) less, and
through host memory when P2P is off. The latency covers the decode instance noticing the
request, the NIXL read's setup and its completion notice, one per request.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from servelab.sim.engine.kv_sizing import kv_bytes_per_token
from servelab.specs.engine_config import EngineConfig

# How many directions the hardware file's figure adds up (NVLink is quoted both ways).
DIRECTIONS = {"nvlink": 2, "pcie": 1, "network": 1}


@dataclass(frozen=True)
class KVTransferParams:
    """The transfer's assumed efficiencies (achieved / one-direction link bandwidth) and its fixed
    cost per request; ``servelab calibrate`` would fit both from a prompt-length sweep."""
    efficiency: dict = field(default_factory=lambda: {"nvlink": 0.8, "pcie": 0.7,
                                                      "network": 0.8})
    latency_s: float = 0.001


@dataclass(frozen=True)
class KVLink:
    kind: str                 # nvlink | pcie | network
    one_way_gb_s: float       # before efficiency
    params: KVTransferParams
    bytes_per_token: float    # per GPU; a TP group's GPUs send their shares side by side

    @property
    def effective_gb_s(self) -> float:
        return self.one_way_gb_s * self.params.efficiency[self.kind]

    def transfer_bytes(self, tokens: int) -> float:
        return tokens * self.bytes_per_token

    def transfer_s(self, tokens: int) -> float:
        return self.params.latency_s + self.transfer_bytes(tokens) / (self.effective_gb_s * 1e9)


def kv_link(config: EngineConfig, link_gb_s: float | None = None,
            params: KVTransferParams | None = None) -> KVLink:
    """The link between the prefill and the decode pool of ``config``'s hardware (or a network
    of ``link_gb_s`` in one direction)."""
    params = params or KVTransferParams()
    hw = config.hardware
    if link_gb_s is not None:
        kind, one_way = "network", float(link_gb_s)
    else:
        kind = hw.link_type
        one_way = hw.link_bandwidth_gb_s / DIRECTIONS[kind]
    return KVLink(kind, one_way, params, kv_bytes_per_token(config))
