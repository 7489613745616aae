"""GPU samples beside a run: NVML on the server's host, or a DCGM exporter's page, every
``interval_s`` (0.25-1 s) from a thread of the runner (which has no gevent), into a JSON-lines
file that is loaded into ``gpu_metrics`` after the run (the master is the database's only writer
while it runs). ``python -m servelab.orchestration.gpu_telemetry --out FILE`` is the same sampler
on its own, for a server whose run happens elsewhere (``servelab ingest-gpu`` loads its file).

``--gpu-telemetry``: ``auto`` (NVML when the server is on this host, i.e. a loopback --target,
and NVML answers; a simulator uses no GPU, so none), ``nvml``, ``dcgm=URL`` (the exporter's
``/metrics``, usually ``http://HOST:9400/metrics``), ``off``. A missing library, driver or
exporter is a note in the run, never a failed run: the rows of the requests are all that matter.

Units as stored: util %, SM clock MHz, memory MiB, power W, temperature C, energy J (NVML's
``nvmlDeviceGetTotalEnergyConsumption`` and DCGM's ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` count
mJ since the driver loaded; NULL on GPUs without the counter, pre-Volta).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from servelab.core.errors import ServelabError

FIELDS = ("util_pct", "sm_clock_mhz", "mem_used_mib", "power_w", "temp_c", "energy_j")
DCGM_FIELDS = {   # dcgm-exporter's default counters (etc/default-counters.csv) -> column, scale
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),
}
SAMPLES_FILE = "gpu_samples.jsonl"


@dataclass(frozen=True)
class TelemetrySpec:
    mode: str              # auto | nvml | dcgm | off
    url: str | None = None


def parse_spec(text: str | None) -> TelemetrySpec:
    text = (text or "auto").strip()
    if text in ("auto", "nvml", "off"):
        return TelemetrySpec(text)
    if text.startswith("dcgm="):
        url = text[5:]
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            return TelemetrySpec("dcgm", url)
    raise ServelabError(f"--gpu-telemetry {text}: allowed auto, nvml, off, or dcgm=URL (the "
                        f"exporter's page, e.g. dcgm=http://127.0.0.1:9400/metrics)")


def is_loopback(url: str | None) -> bool:
    host = urlsplit(url).hostname if url else None
    return host in ("127.0.0.1", "localhost", "::1") or bool(host and host.startswith("127."))


class NvmlSource:
    """The GPUs NVML sees (only those of ``CUDA_VISIBLE_DEVICES`` when it lists indices).
    ``lib`` is the ``pynvml`` module (a stand-in of the same interface in tests)."""
    name = "nvml"

    def __init__(self, lib=None):
        if lib is None:
            try:
                import pynvml as lib
            except ImportError:
                raise ServelabError("the nvidia-ml-py package is not installed "
                                    "(pip install nvidia-ml-py)") from None
        self.lib = lib
        try:
            lib.nvmlInit()
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as exc:
            raise ServelabError(f"NVML did not start ({exc}): no NVIDIA driver here") from None
        indices = list(range(count))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if visible and all(v.strip().isdigit() for v in visible.split(",")):
            indices = [int(v) for v in visible.split(",") if int(v) < count]
        self.gpus = []
        for i in indices:
            handle = lib.nvmlDeviceGetHandleByIndex(i)
            self.gpus.append((i, handle, _text(self._call(lib.nvmlDeviceGetUUID, handle)),
                              _text(self._call(lib.nvmlDeviceGetName, handle))))
        if not self.gpus:
            raise ServelabError("NVML sees no GPU")

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.lib.NVMLError:   # not supported on this GPU, or a transient error: no value
            return None

    def sample(self) -> list[dict]:
        lib, call, now = self.lib, self._call, time.time()
        rows = []
        for index, h, uuid, name in self.gpus:
            util = call(lib.nvmlDeviceGetUtilizationRates, h)
            mem = call(lib.nvmlDeviceGetMemoryInfo, h)
            power = call(lib.nvmlDeviceGetPowerUsage, h)
            energy = call(lib.nvmlDeviceGetTotalEnergyConsumption, h)
            rows.append({"t_unix": now, "source": "nvml", "gpu": index, "uuid": uuid,
                         "name": name, "util_pct": None if util is None else util.gpu,
                         "sm_clock_mhz": call(lib.nvmlDeviceGetClockInfo, h, lib.NVML_CLOCK_SM),
                         "mem_used_mib": None if mem is None else mem.used / 2**20,
                         "power_w": None if power is None else power / 1e3,
                         "temp_c": call(lib.nvmlDeviceGetTemperature, h,
                                        lib.NVML_TEMPERATURE_GPU),
                         "energy_j": None if energy is None else energy / 1e3})
        return rows

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError:
            pass


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def parse_dcgm(text: str, now: float) -> list[dict]:
    """One row per GPU (the ``gpu`` label) of a dcgm-exporter page; MIG instances' series (with
    ``GPU_I_ID``) are left out, the whole GPU's are kept."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: dict[str, dict] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                # prometheus_client names a counter's sample NAME_total, whatever the page says
                field = DCGM_FIELDS.get(s.name) or DCGM_FIELDS.get(s.name.removesuffix("_total"))
                if field is None or "gpu" not in s.labels or "GPU_I_ID" in s.labels:
                    continue
                row = rows.setdefault(s.labels["gpu"], {
                    "t_unix": now, "source": "dcgm", "gpu": int(s.labels["gpu"]),
                    "uuid": s.labels.get("UUID"), "name": s.labels.get("modelName"),
                    **{f: None for f in FIELDS}})
                row[field[0]] = s.value * field[1]
    except ValueError as exc:
        raise ServelabError(f"not a Prometheus page ({exc})") from None
    return sorted(rows.values(), key=lambda r: r["gpu"])


class DcgmSource:
    name = "dcgm"

    def __init__(self, url: str, timeout_s: float = 2.0):
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.path = parts.path or "/metrics"
        self.url, self.timeout_s = url, timeout_s
        if not self.sample():
            raise ServelabError(f"{url}: the page has no DCGM_FI_DEV_* series of a GPU")

    def sample(self) -> list[dict]:
        from servelab.core import bounded_http

        now = time.time()
        answer = bounded_http.fetch(self.base, self.path, deadline_s=self.timeout_s)
        if not answer.ok:
            raise ServelabError(f"{self.url}: {bounded_http.describe(answer.outcome)} "
                                f"({answer.seen()})")
        return parse_dcgm(answer.body.decode("utf-8", "replace"), now)

    def close(self) -> None:
        pass


class GpuSampler:
    """Samples ``source`` every ``interval_s`` on a daemon thread into ``path`` (JSON lines,
    written as they come, so a run that dies keeps what was sampled). Failed samples are counted,
    never raised."""

    def __init__(self, source, path: Path, interval_s: float = 0.5):
        self.source, self.path, self.interval_s = source, Path(path), interval_s
        self.samples = 0
        self.failures = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        with open(self.path, "ab") as out:
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    rows = self.source.sample()
                    out.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
                    out.flush()
                    self.samples += 1
                except Exception as exc:   # a sampler must never take the run down
                    self.failures += 1
                    self.last_error = str(exc)[:200]
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.source.close()

    def note(self) -> str:
        text = (f"gpu_metrics: {self.samples} samples from {self.source.name} every "
                f"{self.interval_s:g} s")
        if self.failures:
            text += f", {self.failures} failed ({self.last_error})"
        return text


def open_source(spec: TelemetrySpec, target: str | None, starts_simulator: bool):
    """(the source, or None, and why none) for a run; never raises for a missing GPU."""
    if spec.mode == "off":
        return None, ""
    if spec.mode == "auto" and (starts_simulator or not is_loopback(target)):
        where = "the simulator uses no GPU" if starts_simulator else (
            "the server is not on this host; give --gpu-telemetry dcgm=URL of its exporter")
        return None, f"gpu_metrics: none ({where})"
    try:
        return (DcgmSource(spec.url) if spec.mode == "dcgm" else NvmlSource()), ""
    except ServelabError as exc:
        return None, f"gpu_metrics: none ({exc})"


def read_samples(path: Path, run_id: str) -> list[dict]:
    """The rows of a samples file; a torn last line (the sampler killed mid-write) is skipped."""
    rows = []
    for line in Path(path).read_bytes().splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict) and "t_unix" in row:
            rows.append({**row, "run_id": run_id})
    return rows


def ingest_samples(con, run_id: str, path: Path, note: str | None = None) -> int:
    """Load a samples file into ``gpu_metrics`` (an earlier load of the same run's replaced)."""
    from servelab.store.telemetry import add_note, replace_rows

    rows = read_samples(path, run_id) if Path(path).is_file() else []
    for source in sorted({r["source"] for r in rows}):
        replace_rows(con, "gpu_metrics", run_id, source,
                     [r for r in rows if r["source"] == source])
    if note:
        add_note(con, run_id, note, "gpu_metrics: ")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    """The sampler on its own, until SIGINT/SIGTERM or ``--duration``."""
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="python -m servelab.orchestration.gpu_telemetry")
    p.add_argument("--out", required=True, help="JSON-lines file to append samples to")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    p.add_argument("--dcgm", metavar="URL", help="read a DCGM exporter instead of NVML")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    args = p.parse_args(argv)
    try:
        source = DcgmSource(args.dcgm) if args.dcgm else NvmlSource()
    except ServelabError as exc:
        print(f"gpu_telemetry: {exc}", flush=True)
        return 2
    sampler = GpuSampler(source, Path(args.out), args.interval).start()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait(args.duration)
    sampler.stop()
    print(sampler.note(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
