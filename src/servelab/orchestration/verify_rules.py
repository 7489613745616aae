"""The rules that hold one server's facts to its variant's claims: each a ``Check``, together a
``Verdict`` (see ``orchestration.verify``, which gathers the facts and stores the verdict).

A run is ``verified`` when the evidence shows the claimed path, ``mismatch`` when it shows another
one, and ``unverified`` when the evidence is missing.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from servelab.orchestration.gpus import Gpu
from servelab.orchestration.serverlog import ServerFacts
from servelab.specs.server_kinds.vllm import versions as vllm_versions
from servelab.specs.variants import Variant

OK, WARN, FAIL, UNKNOWN = "ok", "warn", "fail", "unknown"
FLAG_UNVERIFIED = "unverified"
FLAG_MISMATCH = "variant_mismatch"


@dataclass
class Check:
    name: str
    status: str
    detail: str


@dataclass
class Verdict:
    variant: str
    status: str                  # verified | mismatch | unverified | failed_to_start
    checks: list[Check]
    facts: dict
    sources: list[str] = field(default_factory=list)

    @property
    def flags(self) -> list[str]:
        if self.status == "verified":
            return []
        return [FLAG_MISMATCH] if self.status == "mismatch" else [FLAG_UNVERIFIED]

    def to_json(self, extra: dict | None = None) -> str:
        return json.dumps({"variant": self.variant, "status": self.status,
                           "checks": [asdict(c) for c in self.checks], "sources": self.sources,
                           "facts": self.facts, **(extra or {})}, default=str)

    def summary(self) -> str:
        lines = [f"verify {self.variant}: {self.status.upper()}"
                 + (f"  (from {', '.join(self.sources)})" if self.sources else "")]
        width = max([13] + [len(c.name) for c in self.checks])
        for c in self.checks:
            lines.append(f"  [{c.status:>7}] {c.name:<{width}} {c.detail}")
        return "\n".join(lines)


def _precision(v: Variant, f: ServerFacts, gpus: list[Gpu] | None) -> Check:
    kernels = " ".join(f.kernels)
    path = v.kind.linear_path(f)
    fp8_native, fp8_marlin, int4 = path.fp8_native, path.fp8_weight_only, path.int4
    quant_known = f.engine_config_seen
    c = v.claims
    if c.weights == "fp8":
        if c.activations == "fp8":
            if fp8_marlin:
                return Check("precision", FAIL, "claims W8A8 FP8 but the server runs weight-only FP8 "
                             "through Marlin (W8A16): this GPU has no native FP8 (compute "
                             "capability < 8.9)")
            if fp8_native:
                return Check("precision", OK, f"native FP8 W8A8 ({f.kernels[0]})")
            if quant_known and f.quantization not in ("fp8", "fbgemm_fp8", "compressed-tensors",
                                                      "modelopt", "ptpc_fp8"):
                return Check("precision", FAIL, f"claims FP8 but quantization={f.quantization}")
            if f.quantization == "fp8" and gpus and all(g.cc_number >= 89 for g in gpus):
                return Check("precision", OK, "quantization=fp8 with no Marlin fallback warning on "
                             "GPUs of compute capability >= 8.9 (inferred; no kernel line)")
            return Check("precision", UNKNOWN, "no kernel line or FP8 fallback warning found: cannot "
                         "tell W8A8 from W8A16 (give the full start-up log)")
        if fp8_marlin or fp8_native:
            return Check("precision", OK, "FP8 weights" + (" (Marlin W8A16)" if fp8_marlin else ""))
        return Check("precision", UNKNOWN, "no FP8 kernel line found")
    if c.weights == "int4":
        if f.forced_quantization:
            return Check("precision", WARN, f"int4 weights, but --quantization "
                         f"{f.forced_quantization} forces the slow kernel instead of "
                         f"{f.forced_quantization}_marlin")
        if int4:
            how = f.marlin_conversion or f.kernels[0]
            return Check("precision", OK, f"W4A16 ({how})")
        if quant_known and f.quantization is None:
            return Check("precision", FAIL, "claims int4 weights but quantization=None")
        return Check("precision", UNKNOWN, "no W4A16 kernel line found")
    # 16-bit weights: nothing may be quantized.
    if fp8_native or fp8_marlin or int4 or (f.quantization not in (None, "None")):
        return Check("precision", FAIL, f"claims {c.weights} but the server quantizes "
                     f"(quantization={f.quantization}, kernels: {kernels or 'none'})")
    if quant_known:
        dtype = f" ({f.dtype})" if f.dtype else ""
        return Check("precision", OK, f"unquantized{dtype}")
    return Check("precision", UNKNOWN, "the engine's config line is missing (quantization unknown)")


def _speculative(v: Variant, f: ServerFacts) -> Check:
    want = v.claims.speculative
    want_k = (v.speculative_config or {}).get("num_speculative_tokens")
    if f.speculative_seen:
        got = (f.speculative or {}).get("method")
        if got != want:
            return Check("speculative", FAIL, f"claims {want or 'none'}, server runs {got or 'none'}")
        if want and want_k and f.speculative.get("num_speculative_tokens") not in (None, want_k):
            return Check("speculative", FAIL, f"claims k={want_k}, server uses "
                         f"k={f.speculative['num_speculative_tokens']}")
        return Check("speculative", OK, f"{got or 'none'}"
                     + (f", k={f.speculative.get('num_speculative_tokens')}" if got else ""))
    if f.metrics_seen:
        if bool(want) == f.spec_decode_metrics:
            counters = v.kind.metrics["spec_drafts"].rsplit("_num_", 1)[0] + "_*"
            return Check("speculative", OK, (f"{counters} metrics present" if want else
                                             "no spec decode metrics, as claimed"))
        return Check("speculative", FAIL, f"claims {want or 'none'} but spec decode metrics are "
                     f"{'present' if f.spec_decode_metrics else 'absent'}")
    return Check("speculative", UNKNOWN, "no speculative config in the log, no /metrics")


def _parallel(v: Variant, f: ServerFacts) -> Check:
    problems, seen = [], []
    if f.tensor_parallel_size is not None:
        seen.append(f"TP {f.tensor_parallel_size}")
        if f.tensor_parallel_size != v.tensor_parallel_size:
            problems.append(f"TP {f.tensor_parallel_size}, variant says {v.tensor_parallel_size}")
    # /metrics labels every engine of a data-parallel server; the larger of the two counts holds.
    dp = max([n for n in (f.data_parallel_size, len(f.engines) or None) if n], default=None)
    if dp is not None:
        seen.append(f"DP {dp}")
        allowed = {v.data_parallel_size}
        if v.instances > 1:
            allowed.add(v.instances)  # behind one balancer, or the simulator's engines
        if dp not in allowed:
            problems.append(f"DP {dp}, variant says {v.data_parallel_size}")
    if problems:
        return Check("parallelism", FAIL, "; ".join(problems))
    if not seen:
        return Check("parallelism", UNKNOWN, "no parallel sizes in the log or /metrics")
    if v.tensor_parallel_size > 1 and f.custom_allreduce_disabled:
        return Check("parallelism", WARN, ", ".join(seen) + ": custom all-reduce disabled (no GPU "
                     "P2P); TP all-reduces go through NCCL over PCIe")
    return Check("parallelism", OK, ", ".join(seen))


def _kv_cache(f: ServerFacts, expected_tokens: int | None) -> Check:
    if f.kv_cache_tokens is None:
        return Check("kv_cache", UNKNOWN, "no 'GPU KV cache size' line or cache_config_info")
    text = f"{f.kv_cache_tokens:,} tokens"
    if f.max_concurrency is not None:
        text += f", {f.max_concurrency:.2f}x at {f.max_concurrency_len:,} tokens per request"
    if expected_tokens:
        ratio = f.kv_cache_tokens / expected_tokens
        text += f"; preflight estimated {expected_tokens:,} ({ratio:.2f}x)"
        if not 0.75 <= ratio <= 1.33:
            return Check("kv_cache", WARN, text + ": far from the estimate (another process on "
                         "the GPU, or different flags?)")
    return Check("kv_cache", OK, text)


def _model(v: Variant, f: ServerFacts) -> Check:
    got = f.model or f.metric_model_name
    if got is None:
        return Check("model", UNKNOWN, "model not named in the log or /metrics")
    if got == v.model or got.rstrip("/").endswith("/" + v.model.rstrip("/").split("/")[-1]):
        return Check("model", OK, got)
    hint = ""
    if got.startswith(("/", "./", "~")) and v.model_env:
        hint = (f"; if that folder holds the variant's model, set {v.model_env}={got} so "
                f"servelab reads its config.json")
    return Check("model", FAIL, f"serves {got}, variant says {v.model}{hint}")


def _version(v: Variant, f: ServerFacts, gpus: list[Gpu] | None,
             families: set[str] | None) -> Check:
    """Which vLLM release range the server is in (``vllm_versions``), judged by that range's
    metric names and defaults: a family the release does not define means another version (or a
    fork) than the server says; a warning, never a mismatch, as the claims are about the model."""
    if f.vllm_version is None:
        return Check("version", UNKNOWN, "no version in the log's banner or engine line, and no "
                     "/version answer: judged by vLLM " + vllm_versions.CURRENT + "'s grammar")
    row = vllm_versions.release(f.vllm_version)
    text = (f"vLLM {f.vllm_version} (range {vllm_versions.range_text(row)}, torch "
            f"{row.torch or '?'})")
    if not vllm_versions.is_known(f.vllm_version):
        return Check("version", WARN, f"{text}: newer than the newest release read "
                     f"({vllm_versions.CURRENT}); judged by its grammar")
    problems = []
    defined = vllm_versions.metric_names(f.vllm_version)
    if families and defined:
        exposed = {vllm_versions.exposed_family(n, e["type"]) for n, e in defined.items()}
        alien = sorted(n for n in families if n.startswith("vllm:") and n not in exposed
                       and not n.endswith("_created"))
        if alien:
            problems.append(f"/metrics has {len(alien)} famil{'y' if len(alien) == 1 else 'ies'} "
                            f"{row.label} does not define ({', '.join(alien[:3])}): another "
                            "version or a fork?")
    set_by_variant = any(a.split("=", 1)[0] == "--max-num-batched-tokens" for a in v.serve_args)
    one_kind = bool(gpus) and len({g.name for g in gpus}) == 1
    if f.max_num_batched_tokens and one_kind and not set_by_variant:
        want = row.batched_tokens_default(gpus[0].memory_total_mib / 1024, gpus[0].name)
        if f.max_num_batched_tokens != want:
            problems.append(f"max_num_batched_tokens={f.max_num_batched_tokens}, but {row.label}'s "
                            f"default on a {gpus[0].name} is {want}")
    if problems:
        return Check("version", WARN, f"{text}; " + "; ".join(problems))
    return Check("version", OK, text)


def judge(variant: Variant, facts: ServerFacts, gpus: list[Gpu] | None = None,
          expected_kv_tokens: int | None = None, sources: list[str] | None = None,
          families: set[str] | None = None) -> Verdict:
    checks = []
    if facts.errors:
        checks.append(Check("startup", FAIL, facts.errors[0]))
    checks += [_model(variant, facts), _precision(variant, facts, gpus),
               _speculative(variant, facts), _parallel(variant, facts),
               _kv_cache(facts, expected_kv_tokens)]
    if variant.server == "vllm":
        checks.append(_version(variant, facts, gpus, families))
    if facts.runtime_errors:
        checks.append(Check("runtime", WARN, f"the server logged, while serving: "
                            f"{facts.runtime_errors[0]}"))
    if facts.errors:
        status = "failed_to_start"
    elif any(c.status == FAIL for c in checks):
        status = "mismatch"
    elif any(c.status == UNKNOWN for c in checks if c.name in ("precision", "speculative")):
        status = "unverified"
    else:
        status = "verified"
    return Verdict(variant.name, status, checks, facts.to_dict(), sources or [])
