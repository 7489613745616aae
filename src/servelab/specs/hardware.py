"""GPU specs from ``servers/hardware/*.yaml``: memory, bandwidth, peak TFLOPS, interconnect."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from servelab.core.errors import ServelabError
from servelab.core.paths import servers_dir

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    nvidia_smi_names: tuple[str, ...]
    compute_capability: tuple[int, int]
    memory_gb: float            # marketing size, 10^9 bytes
    memory_mib: int             # nvidia-smi total; the engine sizes its KV cache from this
    bandwidth_gb_s: float       # HBM/GDDR bandwidth, 10^9 bytes/s
    tflops_bf16: float          # dense
    tflops_fp8: float | None    # dense; None where the GPU has no FP8 tensor cores
    tflops_int8: float | None
    link_type: str              # "nvlink" | "pcie"
    link_bandwidth_gb_s: float  # spec
    allreduce_gb_s: float       # effective all-reduce bus bandwidth
    path: Path

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def cc_number(self) -> int:
        """Compute capability as vLLM compares it: 8.9 -> 89."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def native_fp8(self) -> bool:
        return self.cc_number >= 89 and self.tflops_fp8 is not None


def hardware_dir() -> Path:
    return servers_dir() / "hardware"


def list_hardware() -> list[str]:
    return sorted(p.stem for p in hardware_dir().glob("*.yaml"))


def _require(data: dict, key: str, path: Path):
    if key not in data or data[key] is None:
        raise ServelabError(f"{path}: field '{key}' is missing; add it (see servers/hardware/H100.yaml)")
    return data[key]


def _parse(path: Path) -> HardwareSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ServelabError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ServelabError(f"{path}: expected a mapping of fields at the top level")
    cc_text = str(_require(data, "compute_capability", path))
    try:
        major, minor = (int(x) for x in cc_text.split("."))
    except ValueError:
        raise ServelabError(f"{path}: compute_capability: found {cc_text!r}; write it like \"8.9\"") from None
    tflops = _require(data, "tflops_dense", path)
    link = _require(data, "interconnect", path)
    link_type = str(_require(link, "type", path)).lower()
    if link_type not in ("nvlink", "pcie"):
        raise ServelabError(f"{path}: interconnect.type: found {link_type!r}; allowed nvlink, pcie")
    names = data.get("nvidia_smi_names") or [f"NVIDIA {data['name']}"]
    return HardwareSpec(
        name=str(_require(data, "name", path)),
        nvidia_smi_names=tuple(str(n) for n in names),
        compute_capability=(major, minor),
        memory_gb=float(_require(data, "memory_gb", path)),
        memory_mib=int(_require(data, "memory_mib", path)),
        bandwidth_gb_s=float(_require(data, "memory_bandwidth_gb_s", path)),
        tflops_bf16=float(_require(tflops, "bf16", path)),
        tflops_fp8=None if tflops.get("fp8") is None else float(tflops["fp8"]),
        tflops_int8=None if tflops.get("int8") is None else float(tflops["int8"]),
        link_type=link_type,
        link_bandwidth_gb_s=float(_require(link, "bandwidth_gb_s", path)),
        allreduce_gb_s=float(link.get("allreduce_gb_s") or _require(link, "bandwidth_gb_s", path) / 3),
        path=path,
    )


def load_hardware(name: str) -> HardwareSpec:
    """Load a GPU by file stem (``L40S``), case-insensitively, or by its nvidia-smi name."""
    wanted = name.strip().lower()
    for stem in list_hardware():
        if stem.lower() == wanted:
            return _parse(hardware_dir() / f"{stem}.yaml")
    found = hardware_for_gpu_name(name)
    if found is not None:
        return found
    raise ServelabError(
        f"unknown hardware {name!r}; known: {', '.join(list_hardware())} "
        f"(add a file to {hardware_dir()})"
    )


def hardware_for_gpu_name(gpu_name: str) -> HardwareSpec | None:
    """Map an nvidia-smi ``name`` (e.g. ``NVIDIA L40S``) to its spec, or None."""
    wanted = gpu_name.strip().lower()
    for stem in list_hardware():
        spec = _parse(hardware_dir() / f"{stem}.yaml")
        if any(n.lower() == wanted for n in spec.nvidia_smi_names):
            return spec
    return None
