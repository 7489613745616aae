"""Parse ``vllm serve`` flags, spelled as vLLM spells them, into a plain dataclass.

Flags that change the simulation are parsed; flags that only touch logging, networking or file
locations are accepted and recorded in ``ServeArgs.ignored``; anything else is an error naming the
flag, so a variant never silently means something different in the simulator than on a GPU.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from servelab.core.errors import ServelabError

QUANTIZATIONS = ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "compressed-tensors")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
KV_OFFLOADING_BACKENDS = ("native", "lmcache")
# The connectors that are CPU offloading rather than disaggregation: --kv-transfer-config naming
# one is read as offloading (vLLM's --kv-offloading-size sets exactly this connector).
OFFLOADING_CONNECTORS = ("OffloadingConnector", "LMCacheConnectorV1")
# LMCache settings the simulator models, as kv_connector_extra_config spells them ("lmcache."
# + the key of lmcache/v1/config.py, which LMCacheConnectorV1 copies over its config) -> what a
# valid value is. Everything else LMCache reads (layerwise, remote or disk backends, blending)
# changes timing in ways not modelled, so it is refused by name.
LMCACHE_KEYS = {"lmcache.chunk_size": "an integer above 0 (default 256)",
                "lmcache.local_cpu": "true (the local CPU backend is what is modelled)",
                "lmcache.max_local_cpu_size": "GiB per TP rank above 0 (default 5.0)",
                "lmcache.save_decode_cache": "true or false (default false)",
                "lmcache.save_unfull_chunk": "false (partial chunks are not modelled)"}

# Flags that do not change step timing or capacity (--api-key is enforced by the HTTP server,
# sim/server/auth.py, not the engine). name -> takes a value
NO_EFFECT_FLAGS = {
    "--host": True, "--port": True, "--uvicorn-log-level": True, "--api-key": True,
    "--download-dir": True, "--tokenizer": True, "--chat-template": True, "--revision": True,
    "--tokenizer-mode": True, "--load-format": True, "--config-format": True, "--seed": True,
    "--trust-remote-code": False, "--disable-log-requests": False, "--disable-log-stats": False,
    "--enable-log-requests": False, "--disable-uvicorn-access-log": False,
    "--enable-chunked-prefill": False,  # always on in the V1 engine
    "--no-enable-chunked-prefill": False,
    "--swap-space": True,  # V1 preempts by recompute; no CPU swap
    "--enable-force-include-usage": False, "--enable-prompt-tokens-details": False,
    "--enable-auto-tool-choice": False, "--tool-call-parser": True, "--reasoning-parser": True,
    "--generation-config": True, "--max-log-len": True,
    "--otlp-traces-endpoint": True,   # the simulator sends its spans there (sim/server/otlp_export)
    # `servelab sim --enable-logging-iteration-details` writes the lines (sim/server/iteration_log)
    "--enable-logging-iteration-details": False,
}
DOCUMENTED_NO_EFFECT = sorted(NO_EFFECT_FLAGS)

# vLLM's short spellings; specs.variants reads variant files with the same table.
FLAG_ALIASES = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size", "-q": "--quantization",
                "-pp": "--pipeline-parallel-size"}


@dataclass
class ServeArgs:
    """None means "vLLM's default for this GPU and model" (decided by ``build_engine_config``)."""
    model: str | None = None
    quantization: str | None = None
    speculative_config: dict | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # vLLM 0.26's default (its start-up log: "--gpu-memory-utilization=0.9200"); 0.9 before.
    gpu_memory_utilization: float = 0.92
    kv_cache_memory_bytes: int | None = None   # vLLM: this much KV cache, memory profiling skipped
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    served_model_name: list[str] = field(default_factory=list)
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    enforce_eager: bool = False
    disable_custom_all_reduce: bool = False
    dtype: str = "auto"
    enable_prompt_tokens_details: bool = False
    # vLLM's KV connector (disaggregated prefill): no engine step changes, but a simulator that
    # served it as one engine would hide the transfer, so the HTTP simulator refuses it and only
    # predict's two-pool runner (sim.engine.disagg) models it.
    kv_transfer_config: dict | None = None
    # vLLM's CPU KV offloading: --kv-offloading-size (GiB for all TP ranks together) with
    # --kv-offloading-backend (native: the OffloadingConnector; lmcache: LMCacheConnectorV1 with
    # size / TP GiB per rank), or either connector spelled out in --kv-transfer-config: the
    # OffloadingConnector with cpu_bytes_to_use (bytes) or num_cpu_blocks, LMCacheConnectorV1
    # with its "lmcache.*" extra config (``lmcache``, kept as given, LMCACHE_KEYS checked);
    # sim.engine.kv_offload models both tiers.
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    kv_offload_num_cpu_blocks: int | None = None
    lmcache: dict | None = None
    ignored: list[str] = field(default_factory=list)  # accepted flags that do not affect timing
    argv: list[str] = field(default_factory=list)


def _int(flag: str, text: str) -> int:
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t and t[-1] in "km":  # vLLM accepts 32k / 1m for lengths
        mult = 1000 if t[-1] == "k" else 1_000_000
        t = t[:-1]
    try:
        value = int(t) * mult
    except ValueError:
        raise ServelabError(f"serve args: {flag}: found {text!r}; expected an integer") from None
    if value <= 0:
        raise ServelabError(f"serve args: {flag}: found {text!r}; expected a positive integer")
    return value


def _float(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ServelabError(f"serve args: {flag}: found {text!r}; expected a number") from None


def _choice(flag: str, value, allowed) -> object:
    if value not in allowed:
        raise ServelabError(f"serve args: {flag}: found {value!r}; allowed "
                            f"{', '.join(map(str, allowed))}")
    return value


def _memory_fraction(flag: str, text: str) -> float:
    v = _float(flag, text)
    if not 0 < v <= 1:
        raise ServelabError(f"serve args: {flag}: found {v}; allowed (0, 1]")
    return v


# Flags with a value: flag -> (ServeArgs field, how to read the value).
_VALUE_FLAGS = {
    "--model": ("model", lambda flag, v: v),
    "--quantization": ("quantization", lambda flag, v: _choice(flag, v.lower(), QUANTIZATIONS)),
    "--tensor-parallel-size": ("tensor_parallel_size", _int),
    "--data-parallel-size": ("data_parallel_size", _int),
    "--max-num-seqs": ("max_num_seqs", _int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", _int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", _memory_fraction),
    "--kv-cache-memory-bytes": ("kv_cache_memory_bytes", lambda flag, v: _human_int(flag, v)),
    "--max-model-len": ("max_model_len", _int),
    "--kv-cache-dtype": ("kv_cache_dtype",
                         lambda flag, v: _choice(flag, v.lower(), KV_CACHE_DTYPES)),
    "--block-size": ("block_size", lambda flag, v: _choice(flag, _int(flag, v),
                                                           (8, 16, 32, 64, 128))),
    "--dtype": ("dtype", lambda flag, v: v.lower()),
    "--kv-offloading-size": ("kv_offloading_size", lambda flag, v: _gib(flag, v)),
    "--kv-offloading-backend": ("kv_offloading_backend",
                                lambda flag, v: _choice(flag, v.lower(), KV_OFFLOADING_BACKENDS)),
}
# Switches: flag -> (ServeArgs field, the value it sets).
_SWITCHES = {
    "--enable-prefix-caching": ("enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("enable_prefix_caching", False),
    "--enforce-eager": ("enforce_eager", True),
    "--disable-custom-all-reduce": ("disable_custom_all_reduce", True),
}


def _human_int(flag: str, text: str) -> int:
    """vLLM's human_readable_int: 25.6k = 25,600 (k m g t: powers of 1,000), 20G = 20 x 2**30
    (K M G T: powers of 1,024, whole numbers only), or a plain integer."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text.strip())
    if m and m.group(2).islower():
        v = int(float(m.group(1)) * 1000 ** ("kmgt".index(m.group(2)) + 1))
    elif m and "." not in m.group(1):
        v = int(m.group(1)) * 1024 ** ("KMGT".index(m.group(2)) + 1)
    elif not m and text.strip().isdigit():
        v = int(text)
    else:
        raise ServelabError(f"serve args: {flag}: found {text!r}; allowed a byte count such as "
                            "21474836480, 20G (GiB) or 21.5g (10**9)")
    if v <= 0:
        raise ServelabError(f"serve args: {flag}: found {text!r}; allowed a byte count above 0")
    return v


def _gib(flag: str, text: str) -> float:
    v = _float(flag, text)
    if v <= 0:
        raise ServelabError(f"serve args: {flag}: found {text!r}; expected GiB of CPU memory "
                            "above 0, e.g. 64")
    return v


def _offloading_connector(out: "ServeArgs", config: dict) -> None:
    """The OffloadingConnector spelled out: its CPU size from cpu_bytes_to_use or num_cpu_blocks."""
    flag = "--kv-transfer-config"
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ServelabError(f"serve args: {flag}: kv_connector_extra_config: expected a JSON object")
    size, blocks = extra.get("cpu_bytes_to_use"), extra.get("num_cpu_blocks")
    if isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0:
        out.kv_offloading_size = size / (1 << 30)
    elif isinstance(blocks, int) and not isinstance(blocks, bool) and blocks > 0:
        out.kv_offload_num_cpu_blocks = blocks
    else:
        raise ServelabError(
            f"serve args: {flag}: OffloadingConnector needs kv_connector_extra_config."
            f"cpu_bytes_to_use (bytes > 0) or num_cpu_blocks (> 0); found {extra!r} (or use "
            "--kv-offloading-size GiB)")
    out.kv_offloading_backend = "native"


def _lmcache_connector(out: "ServeArgs", config: dict) -> None:
    """LMCacheConnectorV1 spelled out: its settings from the "lmcache.*" extra config."""
    flag = "--kv-transfer-config"
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ServelabError(f"serve args: {flag}: kv_connector_extra_config: expected a JSON object")
    allowed = "; ".join(f"{k}: {v}" for k, v in LMCACHE_KEYS.items())
    for key, value in extra.items():
        ok = {"lmcache.chunk_size": isinstance(value, int) and not isinstance(value, bool)
              and value > 0,
              "lmcache.local_cpu": value is True,
              "lmcache.max_local_cpu_size": isinstance(value, (int, float))
              and not isinstance(value, bool) and value > 0,
              "lmcache.save_decode_cache": isinstance(value, bool),
              "lmcache.save_unfull_chunk": value is False}.get(key)
        if not ok:
            raise ServelabError(
                f"serve args: {flag}: LMCacheConnectorV1 kv_connector_extra_config.{key}: found "
                f"{value!r}; the simulator models {allowed} (set the others on a real server "
                "only, or drop them)")
    out.lmcache = dict(extra)
    out.kv_offloading_backend = "lmcache"


def _json_object(flag: str, text: str, example: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ServelabError(f"serve args: {flag}: not valid JSON ({exc}); e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise ServelabError(f"serve args: {flag}: expected a JSON object, e.g. '{example}'")
    return value


def _speculative_config(text: str) -> dict:
    return _json_object("--speculative-config", text,
                        '{"method":"ngram","num_speculative_tokens":5}')


def parse_serve_args(argv: list[str] | tuple[str, ...] | None) -> ServeArgs:
    out = ServeArgs(argv=list(argv or []))
    args = _Argv(argv)
    while not args.done():
        raw = args.next()
        if not raw.startswith("-"):
            if out.model is None and args.i == 1:  # `vllm serve MODEL ...`
                out.model = raw
                continue
            raise ServelabError(f"serve args: unexpected value {raw!r}; flags look like --max-num-seqs 64")
        flag, _, inline = raw.partition("=")
        _read_flag(out, args, FLAG_ALIASES.get(flag, flag), inline if "=" in raw else None)
    return out


class _Argv:
    """The serve args read left to right: a flag's value is inline (``--x=v``) or the next item."""

    def __init__(self, argv):
        self.items = list(argv or [])
        self.i = 0

    def done(self) -> bool:
        return self.i >= len(self.items)

    def next(self) -> str:
        self.i += 1
        return self.items[self.i - 1]

    def value_of(self, flag: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if self.done() or (self.items[self.i].startswith("--") and flag != "--speculative-config"):
            raise ServelabError(f"serve args: {flag} needs a value")
        return self.next()

    def words(self) -> list[str]:
        """The items up to the next flag (``--served-model-name a b``)."""
        out = []
        while not self.done() and not self.items[self.i].startswith("-"):
            out.append(self.next())
        return out


def _read_flag(out: ServeArgs, args: _Argv, flag: str, inline: str | None) -> None:
    if flag in _VALUE_FLAGS:
        name, read = _VALUE_FLAGS[flag]
        setattr(out, name, read(flag, args.value_of(flag, inline)))
    elif flag in _SWITCHES:
        name, value = _SWITCHES[flag]
        setattr(out, name, value)
    elif flag == "--speculative-config":
        out.speculative_config = _speculative_config(args.value_of(flag, inline))
    elif flag == "--kv-transfer-config":
        _kv_transfer_config(out, args.value_of(flag, inline))
    elif flag == "--pipeline-parallel-size":
        if _int(flag, args.value_of(flag, inline)) != 1:
            raise ServelabError("serve args: --pipeline-parallel-size > 1 is not simulated; "
                                "use --tensor-parallel-size or --data-parallel-size")
    elif flag == "--served-model-name":
        names = ([inline] if inline is not None else []) + args.words()
        if not names:
            raise ServelabError("serve args: --served-model-name needs a value")
        out.served_model_name = names
    elif flag in NO_EFFECT_FLAGS:
        if flag == "--enable-prompt-tokens-details":
            out.enable_prompt_tokens_details = True
        if NO_EFFECT_FLAGS[flag]:
            out.ignored.append(f"{flag}={args.value_of(flag, inline)}")
        else:
            out.ignored.append(flag)
    else:
        raise _unknown_flag(flag)


def _kv_transfer_config(out: ServeArgs, text: str) -> None:
    config = _json_object("--kv-transfer-config", text,
                          '{"kv_connector":"NixlConnector","kv_role":"kv_both"}')
    connector = config.get("kv_connector")
    if connector == "OffloadingConnector":
        _offloading_connector(out, config)
    elif connector == "LMCacheConnectorV1" and config.get("kv_role") == "kv_both":
        _lmcache_connector(out, config)   # a producer/consumer role is PD, not a tier
    else:
        out.kv_transfer_config = config


def _unknown_flag(flag: str) -> ServelabError:
    return ServelabError(
        f"serve args: unknown or unsimulated vLLM flag {flag!r}; simulated flags: --quantization, "
        "--speculative-config, --tensor-parallel-size, --data-parallel-size, --max-num-seqs, "
        "--max-num-batched-tokens, --gpu-memory-utilization, --kv-cache-memory-bytes, "
        "--max-model-len, "
        "--[no-]enable-prefix-caching, --served-model-name, --kv-cache-dtype, --block-size, "
        "--enforce-eager, --disable-custom-all-reduce, --dtype, --kv-offloading-size, "
        "--kv-offloading-backend, --kv-transfer-config (OffloadingConnector, "
        "LMCacheConnectorV1 kv_both; others "
        "predict only); accepted without effect: "
        + ", ".join(DOCUMENTED_NO_EFFECT)
    )
