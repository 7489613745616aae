"""The GPUs of this host, as nvidia-smi reports them (live, or a saved copy of the same output).

``nvidia-smi --query-gpu=index,name,compute_cap,memory.total,memory.used --format=csv`` gives the
inventory; ``nvidia-smi topo -m`` says how each pair of GPUs is linked (``NV#`` = NVLink).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servelab.core.errors import ServelabError

QUERY_FIELDS = ("index", "name", "compute_cap", "memory.total", "memory.used")
QUERY_COMMAND = ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv"]
TOPOLOGY_COMMAND = ["nvidia-smi", "topo", "-m"]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MIB = re.compile(r"^(\d+)\s*MiB$")
_BARE = re.compile(r"^(\d+)$")   # --format=csv,noheader,nounits
# The plain table: "|   0  NVIDIA H200      On  |   00000000:00:06.0 Off |" then the memory row.
_TABLE_ROW = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+[0-9A-Fa-f]{4,8}:")
_TABLE_MEMORY = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_total_mib: int
    memory_used_mib: int

    @property
    def cc_number(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def cc_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    @property
    def memory_free_mib(self) -> int:
        return self.memory_total_mib - self.memory_used_mib


def parse_gpu_csv(text: str, source: str = "nvidia-smi") -> list[Gpu]:
    """Parse the CSV (with or without its header line, with or without units, extra columns
    such as memory.free ignored) into GPUs, in index order. The plain ``nvidia-smi`` table,
    which users paste as often as the query, is read too (``parse_gpu_table``)."""
    if _TABLE_ROW.search(text) or "NVIDIA-SMI" in text:
        return parse_gpu_table(text, source)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ServelabError(f"{source}: empty; expected the output of {' '.join(QUERY_COMMAND)}")
    first = [cell.strip() for cell in lines[0].split(",")]
    columns, start = list(QUERY_FIELDS), 0
    if first and not first[0].isdigit() and any(c.split(" [")[0] in QUERY_FIELDS for c in first):
        columns = [cell.split(" [")[0] for cell in first]
        if not all(f in columns for f in QUERY_FIELDS[1:]):
            raise ServelabError(f"{source}:1: header: found {', '.join(first)}; expected the columns "
                                f"{', '.join(QUERY_FIELDS)} (run {' '.join(QUERY_COMMAND)})")
        start = 1
    gpus = []
    for number, line in enumerate(lines[start:], start + 1):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(columns):
            raise ServelabError(f"{source}:{number}: found {len(cells)} columns; expected "
                                f"{len(columns)} ({', '.join(columns)})"
                                + ("" if start else "; keep the header line, or query exactly "
                                   "these columns"))
        row = dict(zip(columns, cells))
        index = row.get("index", str(number - start - 1))
        name, cc = row["name"], row["compute_cap"]
        try:
            major, minor = (int(x) for x in cc.split("."))
        except ValueError:
            raise ServelabError(f"{source}:{number}: compute_cap: found {cc!r}; expected like 8.9 "
                                f"(a driver too old to report it needs an upgrade)") from None
        mems = []
        for field in ("memory.total", "memory.used"):
            value = row[field]
            match = _MIB.match(value) if start else (_MIB.match(value) or _BARE.match(value))
            if not match:
                raise ServelabError(f"{source}:{number}: {field}: found {value!r}; expected like "
                                    f"'46068 MiB'")
            mems.append(int(match.group(1)))
        if not index.isdigit():
            raise ServelabError(f"{source}:{number}: index: found {index!r}; expected 0, 1, ...")
        gpus.append(Gpu(int(index), name, (major, minor), mems[0], mems[1]))
    if not gpus:
        raise ServelabError(f"{source}: no GPU rows after the header")
    return sorted(gpus, key=lambda g: g.index)


def parse_gpu_table(text: str, source: str = "nvidia-smi") -> list[Gpu]:
    """The plain ``nvidia-smi`` table: index and name on a GPU's first row, memory on its second.
    The table has no compute capability, so the GPU must be one servers/hardware knows."""
    from servelab.specs.hardware import hardware_for_gpu_name

    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    gpus = []
    for number, line in enumerate(lines, 1):
        head = _TABLE_ROW.match(line)
        if not head:
            continue
        memory = next((m for m in map(_TABLE_MEMORY.search, lines[number:number + 2]) if m), None)
        if memory is None:
            raise ServelabError(f"{source}:{number + 1}: no 'USED MiB / TOTAL MiB' under GPU "
                                f"{head.group(1)}; save the table whole, or the CSV query "
                                f"`{' '.join(QUERY_COMMAND)}`")
        name = head.group(2).strip()
        known = hardware_for_gpu_name(name)
        if known is None:
            raise ServelabError(f"{source}:{number}: GPU {head.group(1)} is {name!r}, which "
                                f"servers/hardware does not list, and the plain nvidia-smi table "
                                f"has no compute capability; save `{' '.join(QUERY_COMMAND)}` "
                                f"instead")
        gpus.append(Gpu(int(head.group(1)), known.nvidia_smi_names[0], known.compute_capability,
                        int(memory.group(2)), int(memory.group(1))))
    if not gpus:
        raise ServelabError(f"{source}: no GPU rows in the nvidia-smi table; save "
                            f"`{' '.join(QUERY_COMMAND)}` instead")
    return sorted(gpus, key=lambda g: g.index)


def _run(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        raise ServelabError(f"{command[0]} not found: this host has no NVIDIA driver. Give a saved "
                            f"copy with --gpus FILE (e.g. servers/gpus/l40s.csv) or --hardware NAME")
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise ServelabError(f"{' '.join(command)} failed ({done.returncode}): "
                            f"{(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def read_gpus(path: str | Path | None = None) -> list[Gpu]:
    """GPUs from a saved CSV file, or from running nvidia-smi when no file is given."""
    if path is None:
        return parse_gpu_csv(_run(QUERY_COMMAND), "nvidia-smi")
    path = Path(path)
    if not path.is_file():
        raise ServelabError(f"{path}: no such file; save one with "
                            f"`{' '.join(QUERY_COMMAND)} > {path.name}`")
    return parse_gpu_csv(path.read_text(encoding="utf-8"), str(path))


def parse_topology(text: str, source: str = "nvidia-smi topo -m") -> dict[tuple[int, int], str]:
    """Link type for each ordered pair of GPUs: 'NV18', 'PHB', 'SYS', 'NODE', 'PIX', 'PXB'."""
    rows = [_ANSI.sub("", line).rstrip("\n") for line in text.splitlines()]
    header = next((r for r in rows if r.strip().startswith("GPU0")), None)
    if header is None:
        raise ServelabError(f"{source}: no matrix header (GPU0 GPU1 ...); save the output of "
                            f"`nvidia-smi topo -m`")
    columns = [c.strip() for c in header.split("\t") if c.strip()]
    gpu_cols = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    # The matrix ends at the first blank line; newer drivers print more GPU-by-GPU tables (P2P
    # read/write status, with OK/NS cells) after the legend, which are not links.
    for row in rows[rows.index(header) + 1:]:
        if not row.strip() or row.strip().startswith("Legend"):
            break
        cells = row.split("\t")
        label = cells[0].strip()
        if not re.fullmatch(r"GPU\d+", label):
            continue
        values = [c.strip() for c in cells[1:1 + len(gpu_cols)]]
        i = int(label[3:])
        for col, value in zip(gpu_cols, values):
            j = int(col[3:])
            if i != j:
                links[(i, j)] = value
    if not links and len(gpu_cols) > 1:
        raise ServelabError(f"{source}: found no GPU rows under the header")
    return links


def read_topology(path: str | Path | None = None) -> dict[tuple[int, int], str]:
    if path is None:
        return parse_topology(_run(TOPOLOGY_COMMAND))
    path = Path(path)
    if not path.is_file():
        raise ServelabError(f"{path}: no such file; save one with `nvidia-smi topo -m > {path.name}`")
    return parse_topology(path.read_text(encoding="utf-8"), str(path))


def all_nvlink(links: dict[tuple[int, int], str], indices: list[int]) -> bool:
    """True when every pair among ``indices`` is joined by NVLink (``NV#``)."""
    return all(links.get((i, j), "").startswith("NV") for i in indices for j in indices if i != j)
