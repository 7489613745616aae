"""Where vLLM releases differ in what servelab reads or imitates: metric names, start-up lines,
defaults and flags. One row per version range, each read from that release's own wheel
(``servers/captured/vllm_versions/README.md``: which wheels, when, how, and the findings).

``release(version)`` picks the row for a server's reported version (``/version``, the banner or
the engine's config line); ``servelab verify`` and the simulator ask it rather than branching on
version numbers, so a new release is one new row (and its vendored metric list).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

CURRENT = "0.33.0"   # the newest release read (PyPI, 2026-11): the simulator's default
# Releases servelab ran on a real H200 (servers/captured/): the only tags compose may default to.
MEASURED_ON_H200 = ("0.26.0",)

# The KV capacity line(s): 0.26 logs two lines, 0.28 joins them, 0.31+ names the pool ("GPU",
# "GPU + host" with HiSparse); the words after the pool are the same, so one parser reads all.
_KV_TWO = ("GPU KV cache size: {tokens:,} tokens",
           "Maximum concurrency for {max_len:,} tokens per request: {conc:.2f}x")
_KV_ONE = ("GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {max_len:,} tokens per "
           "request: {conc:.2f}x",)

_LOADING_MEMORY = "Model loading took {gib} GiB memory and {s} seconds"


@dataclass(frozen=True)
class VllmRelease:
    since: str                        # first version of the range; it runs to the next row's
    torch: str | None                 # the wheel's torch pin (what a host must have or carry)
    metric_names: str | None          # key in data/vllm_metric_names.json (None: not vendored)
    kv_cache_lines: tuple[str, ...]
    banner: str                       # the API server's version line, logo off
    # `vllm serve`'s --max-num-batched-tokens default by GPU memory: the first (min GiB, tokens)
    # the GPU reaches (engine/arg_utils.py; A100s and GB10 are held to the small tier by name).
    batched_tokens_tiers: tuple[tuple[int, int], ...]
    # Speculative methods with which async scheduling is off by default (config/vllm.py).
    async_off_for: tuple[str, ...]
    # How the linear-kernel line names the layer method per checkpoint method, and the engine
    # config line's quantization= value for it (0.26+ maps gptq/awq to AutoGPTQ/AutoAWQ).
    linear_methods: dict = field(default_factory=dict)
    engine_quantization: dict = field(default_factory=dict)
    marlin_conversion_line: bool = False   # "The model is convertible to gptq_marlin ..." (<0.26)
    loading_line: str = "Model loading took {gib} GiB and {s} seconds"   # V2 model runner
    new_flags: tuple[str, ...] = ()        # serve flags first accepted in this range
    gpu_memory_utilization: float = 0.92

    @property
    def label(self) -> str:
        return ".".join(self.since.split(".")[:2])

    def batched_tokens_default(self, gpu_memory_gib: float, gpu_name: str = "") -> int:
        if "a100" in gpu_name.lower() or "gb10" in gpu_name.lower():
            return self.batched_tokens_tiers[-1][1]
        return next(tokens for gib, tokens in self.batched_tokens_tiers if gpu_memory_gib >= gib)


_AUTO = {"linear_methods": {"gptq": "AutoGPTQLinearMethod", "awq": "AutoAWQMarlinLinearMethod",
                            "fp8": "Fp8PerTensorOnlineLinearMethod"},
         "engine_quantization": {"gptq": "auto_gptq", "awq": "auto_awq"}}
# Methods that are neither EAGLE-like nor ngram_gpu/dspark turn async scheduling off (0.26-0.31).
_ASYNC_OFF_V1 = ("ngram", "draft_model", "medusa", "mlp_speculator", "suffix")

RELEASES = (
    # The simulator's dialect before this table (its first reference notes); no wheel read here.
    VllmRelease("0.11.0", None, None, _KV_TWO, "vLLM API server version {version}",
                ((70, 8192), (0, 2048)), _ASYNC_OFF_V1,
                {"gptq": "GPTQMarlinLinearMethod", "awq": "AWQMarlinLinearMethod",
                 "fp8": "Fp8LinearMethod"},
                {"gptq": "gptq_marlin", "awq": "awq_marlin"}, marlin_conversion_line=True),
    VllmRelease("0.26.0", "2.11.0", "0.26.0", _KV_TWO, "vLLM server version {version}, serving "
                "model {model}", ((70, 8192), (0, 2048)), _ASYNC_OFF_V1, **_AUTO),
    VllmRelease("0.28.0", "2.13.0", "0.28.0", _KV_ONE, "vLLM server version {version}, serving "
                "model {model}", ((160, 16384), (70, 8192), (0, 2048)), _ASYNC_OFF_V1, **_AUTO,
                loading_line=_LOADING_MEMORY),
    VllmRelease("0.31.0", "2.13.0", "0.31.0", _KV_ONE, "vLLM server version {version}, serving "
                "model {model}", ((160, 16384), (70, 8192), (0, 2048)), _ASYNC_OFF_V1, **_AUTO,
                loading_line=_LOADING_MEMORY),
    # Model Runner V2 (the default) runs ngram and draft models with async scheduling on.
    VllmRelease("0.33.0", "2.14.0", "0.33.0", _KV_ONE, "vLLM server version {version}, serving "
                "model {model}", ((160, 16384), (70, 8192), (0, 2048)), ("suffix",), **_AUTO,
                loading_line=_LOADING_MEMORY,
                new_flags=("--max-num-queued-reqs", "--max-num-queued-tokens", "--watermark-config",
                           "--sleep-mode-offload-cudagraph")),
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``0.33.0``, ``v0.26.0``, ``0.33.0+servelab.sim``, ``0.31.1rc2`` -> (major, minor, patch);
    None for what is not a vLLM version (``servelab-sim-1.2``, ``None``)."""
    m = _VERSION.match(text.strip()) if isinstance(text, str) else None
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def release(version: str | None) -> VllmRelease:
    """The row whose range holds ``version``; the current release when the version is unknown
    (a server that does not say is most likely today's), the oldest row for anything older."""
    found = parse_version(version) or parse_version(CURRENT)
    chosen = RELEASES[0]
    for row in RELEASES:
        if parse_version(row.since) <= found:
            chosen = row
    return chosen


def range_text(row: VllmRelease) -> str:
    """``[0.26, 0.28)``: the versions a row covers (the last row is open-ended)."""
    later = [r for r in RELEASES if parse_version(r.since) > parse_version(row.since)]
    return f"[{row.label}, {later[0].label})" if later else f"[{row.label}, ...)"


def is_known(version: str | None) -> bool:
    """Whether ``version`` falls inside the table's read ranges (not newer than CURRENT's minor)."""
    v = parse_version(version)
    return v is not None and v[:2] <= parse_version(CURRENT)[:2]


@lru_cache(maxsize=1)
def _vendored() -> dict:
    text = resources.files("servelab").joinpath("data/vllm_metric_names.json").read_text("utf-8")
    return json.loads(text)


def metric_names(version: str | None) -> dict[str, dict]:
    """Every metric family the release defines: name -> {type, labels, file}; empty for a row
    whose wheel was not read."""
    key = release(version).metric_names
    return dict(_vendored()["versions"][key]) if key else {}


def exposed_family(name: str, kind: str) -> str:
    """The family name a Prometheus parser reports: a counter's ``_total`` is its samples'."""
    return name.removesuffix("_total") if kind == "counter" else name
