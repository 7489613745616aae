"""GPU specs from ``servers/hardware/*.yaml``: memory, bandwidth, peak TFLOPS, interconnect."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelab.core import yamlsource
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


class _Fields:
    """A hardware file's fields, each problem named with its file, line and field."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.doc = yamlsource.parse(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ServelabError(f"{path}: cannot read it ({exc.strerror})") from None
        except yamlsource.YamlSyntaxError as exc:
            raise ServelabError(f"{path}:{exc.line}: not valid YAML: {exc}") from None
        for field_path, line, first in self.doc.duplicates:
            self.fail(field_path, f"given twice (lines {first} and {line}); keep one", line)
        if not isinstance(self.doc.data, dict):
            self.fail((), "expected a mapping of fields at the top level")

    def fail(self, field: tuple, problem: str, line: int | None = None):
        raise ServelabError(yamlsource.field_message(self.path, self.doc, field, problem, line))

    def get(self, *field: str, required: bool = True):
        node = self.doc.data
        for i, key in enumerate(field):
            if not isinstance(node, dict):
                self.fail(field[:i], f"found {node!r}; expected a mapping with '{key}'")
            node = node.get(key)
        if node is None and required:
            self.fail(field, "missing; add it (see servers/hardware/H100.yaml)")
        return node

    def number(self, *field: str, required: bool = True) -> float | None:
        value = self.get(*field, required=required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.fail(field, f"found {value!r}; write a positive number")
        return float(value)


def read_hardware_file(path: Path) -> HardwareSpec:
    """One servers/hardware file, checked: a problem names its file, line and field."""
    f = _Fields(path)
    cc_text = str(f.get("compute_capability"))
    try:
        major, minor = (int(x) for x in cc_text.split("."))
    except ValueError:
        f.fail(("compute_capability",), f"found {cc_text!r}; write it like \"8.9\"")
    link_type = str(f.get("interconnect", "type")).lower()
    if link_type not in ("nvlink", "pcie"):
        f.fail(("interconnect", "type"), f"found {link_type!r}; allowed nvlink, pcie")
    name = str(f.get("name"))
    names = f.get("nvidia_smi_names", required=False) or [f"NVIDIA {name}"]
    if not isinstance(names, list):
        f.fail(("nvidia_smi_names",), f"found {names!r}; write a list of names")
    link_bw = f.number("interconnect", "bandwidth_gb_s")
    return HardwareSpec(
        name=name,
        nvidia_smi_names=tuple(str(n) for n in names),
        compute_capability=(major, minor),
        memory_gb=f.number("memory_gb"),
        memory_mib=int(f.number("memory_mib")),
        bandwidth_gb_s=f.number("memory_bandwidth_gb_s"),
        tflops_bf16=f.number("tflops_dense", "bf16"),
        tflops_fp8=f.number("tflops_dense", "fp8", required=False),
        tflops_int8=f.number("tflops_dense", "int8", required=False),
        link_type=link_type,
        link_bandwidth_gb_s=link_bw,
        allreduce_gb_s=f.number("interconnect", "allreduce_gb_s", required=False) or link_bw / 3,
        path=path,
    )


def load_hardware(name: str) -> HardwareSpec:
    """Load a GPU by file stem (``L40S``), case-insensitively, or by its nvidia-smi name."""
    wanted = name.strip().lower()
    for stem in list_hardware():
        if stem.lower() == wanted:
            return read_hardware_file(hardware_dir() / f"{stem}.yaml")
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
        spec = read_hardware_file(hardware_dir() / f"{stem}.yaml")
        if any(n.lower() == wanted for n in spec.nvidia_smi_names):
            return spec
    return None
