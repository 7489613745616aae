"""Before measuring: will this variant run, on these GPUs, as what it claims to be?

Memory figures come from the simulator engine's start-up sizing (``servelab.sim.engine.kv_sizing``), the
one place that turns GPU memory, weights, activations and the KV layout into blocks. Preflight
adds what only the host knows: how many GPUs there are, their compute capability, memory already
in use, and whether they are joined by NVLink.

Verdicts: ``refuse`` (the measurement would fail or mean something else: exit 1), ``warn`` (it
runs, but read the result with this in mind: exit 0, or 1 with ``--strict``), ``ok``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import islice

from servelab.core.errors import ServelabError
from servelab.orchestration.gpus import Gpu, all_nvlink
from servelab.specs.hardware import HardwareSpec, hardware_for_gpu_name, load_hardware
from servelab.specs.variants import Variant

REFUSE, WARN, OK = "refuse", "warn", "ok"
LENGTH_SAMPLE = 2000


@dataclass
class Verdict:
    level: str
    reason: str


@dataclass
class ProfileLengths:
    """Request lengths (prompt + output tokens, sorted) and the peak load of a traffic profile."""
    name: str
    totals: tuple[int, ...]
    peak_concurrency: int | None   # highest user count or in-flight cap; None when unbounded
    shared_prefix: bool = False    # some class shares a prefix, which the prefix cache stores once

    @property
    def mean_tokens(self) -> float:
        return sum(self.totals) / len(self.totals)

    @property
    def p99_tokens(self) -> int:
        return self.totals[min(len(self.totals) - 1, int(0.99 * len(self.totals)))]

    @property
    def max_tokens(self) -> int:
        return self.totals[-1]

    def share_over(self, limit: int) -> float:
        return sum(1 for t in self.totals if t > limit) / len(self.totals)

    def to_dict(self) -> dict:
        return {"name": self.name, "requests_sampled": len(self.totals),
                "mean_tokens": round(self.mean_tokens, 1), "p99_tokens": self.p99_tokens,
                "max_tokens": self.max_tokens, "peak_concurrency": self.peak_concurrency,
                "shared_prefix": self.shared_prefix}


@dataclass
class PreflightReport:
    variant: str
    gpus: list[Gpu]
    gpu_source: str
    hardware: str
    model: str
    quant_path: str
    kernel: str
    weights_gib: float | None = None
    kv_bytes_per_token: float | None = None
    available_kv_gib: float | None = None
    kv_tokens: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_concurrency: float | None = None           # at max-model-len, as vLLM logs it
    profile: ProfileLengths | None = None
    concurrency_at_profile: float | None = None    # at the profile's mean request length
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return any(v.level == REFUSE for v in self.verdicts)

    @property
    def warned(self) -> bool:
        return any(v.level == WARN for v in self.verdicts)

    @property
    def status(self) -> str:
        return REFUSE if self.refused else WARN if self.warned else OK

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["gpus"] = [dataclasses.asdict(g) for g in self.gpus]
        data["verdicts"] = [dataclasses.asdict(v) for v in self.verdicts]
        data["profile"] = self.profile.to_dict() if self.profile else None
        data["status"] = self.status
        return data

    def render(self) -> str:
        g = self.gpus[0] if self.gpus else None
        head = (f"preflight {self.variant} on {len(self.gpus)}x {g.name} (compute capability "
                f"{g.cc_text}, {g.memory_total_mib:,} MiB, {g.memory_used_mib:,} MiB used)"
                if g else f"preflight {self.variant}")
        lines = [head + f"  [{self.gpu_source}]",
                 f"  model             {self.model}",
                 f"  linear layers     {self.quant_path} ({self.kernel})"]
        if self.weights_gib is not None:
            lines.append(f"  weights           {self.weights_gib:.2f} GiB per GPU")
        if self.kv_bytes_per_token is not None:
            lines.append(f"  KV bytes/token    {self.kv_bytes_per_token / 1024:.1f} KiB per GPU "
                         f"({self.kv_bytes_per_token:,.0f} B)")
        if self.kv_tokens is not None:
            lines.append(f"  KV cache          {self.available_kv_gib:.2f} GiB -> "
                         f"{self.kv_tokens:,} tokens")
        if self.max_concurrency is not None:
            lines.append(f"  max concurrency   {self.max_concurrency:.1f}x at max-model-len "
                         f"{self.max_model_len:,} (vLLM's figure); max-num-seqs "
                         f"{self.max_num_seqs}")
        if self.profile is not None and self.concurrency_at_profile is not None:
            p = self.profile
            peak = f"; the profile peaks at {p.peak_concurrency}" if p.peak_concurrency else ""
            lines.append(f"  at the profile    {self.concurrency_at_profile:.1f} requests of "
                         f"{p.mean_tokens:,.0f} tokens (mean prompt+output of {p.name}; p99 "
                         f"{p.p99_tokens:,}){peak}")
        lines.append("verdicts:")
        for v in self.verdicts or [Verdict(OK, "no problem found")]:
            lines.append(f"  {v.level.upper():<7} {v.reason}")
        lines.append(f"result: {self.status.upper()}")
        return "\n".join(lines)


def gpus_from_hardware(name: str, count: int) -> list[Gpu]:
    hw = load_hardware(name)
    return [Gpu(i, hw.nvidia_smi_names[0], hw.compute_capability, hw.memory_mib, 0)
            for i in range(count)]


def spec_for_gpu(gpu: Gpu) -> tuple[HardwareSpec, bool]:
    """The hardware spec for an nvidia-smi GPU, with its real memory; (spec, known)."""
    known = hardware_for_gpu_name(gpu.name)
    if known is not None:
        return dataclasses.replace(known, memory_mib=gpu.memory_total_mib,
                                   compute_capability=gpu.compute_capability), True
    # Not in servers/hardware: sizing needs only memory and compute capability; speed is unknown.
    return HardwareSpec(name=gpu.name, nvidia_smi_names=(gpu.name,),
                        compute_capability=gpu.compute_capability,
                        memory_gb=gpu.memory_total_mib * 2**20 / 1e9,
                        memory_mib=gpu.memory_total_mib, bandwidth_gb_s=0.0, tflops_bf16=0.0,
                        tflops_fp8=None if gpu.cc_number < 89 else 0.0, tflops_int8=None,
                        link_type="pcie", link_bandwidth_gb_s=0.0, allreduce_gb_s=0.0,
                        path=None), False


def profile_lengths(path: str) -> ProfileLengths:
    from servelab.profiles import load_profile
    from servelab.profiles.planner import RequestPlanner

    profile = load_profile(path)
    planner = RequestPlanner(profile)
    totals = []
    # A session's later turns resend the whole history: their KV footprint is the context so far.
    for session in islice(planner.sessions(), LENGTH_SAMPLE):
        context = 0
        for req in session:
            context += req.prompt_tokens + req.output_tokens
            totals.append(context)
    totals.sort()
    if not totals:
        raise ServelabError(f"{path}: the profile plans no requests")
    peaks = []
    for stage in planner.stages():
        if stage.kind in ("concurrency", "ramp") and stage.users:
            peaks.append(int(stage.users))
        elif getattr(stage, "max_in_flight", None):
            peaks.append(int(stage.max_in_flight))
    return ProfileLengths(name=getattr(profile, "name", str(path)), totals=tuple(totals),
                          peak_concurrency=max(peaks) if peaks else None,
                          shared_prefix=any(c.prefix_tokens > 0 for c in profile.classes))


def run_preflight(variant: Variant, gpus: list[Gpu], gpu_source: str,
                  links: dict[tuple[int, int], str] | None = None,
                  profile: ProfileLengths | None = None) -> PreflightReport:
    from servelab.sim.engine.kv_sizing import plan_kv_cache
    from servelab.specs.engine_config import build_engine_config

    if not gpus:
        raise ServelabError(f"{gpu_source}: no GPUs listed")
    used = gpus[:variant.gpus]
    hw, known = spec_for_gpu(used[0])
    config = build_engine_config(hw, variant.model, list(variant.serve_args))
    plan = plan_kv_cache(config)
    report = PreflightReport(variant=variant.name, gpus=gpus, gpu_source=gpu_source,
                             hardware=hw.name, model=variant.model, quant_path=config.quant.name,
                             kernel=config.quant.kernel, max_model_len=config.max_model_len,
                             max_num_seqs=config.max_num_seqs, profile=profile)
    say = report.verdicts.append
    if not known:
        say(Verdict(WARN, f"{used[0].name} is not in servers/hardware: memory comes from "
                          f"nvidia-smi, but the simulator cannot predict its speed"))
    if len(gpus) < variant.gpus:
        say(Verdict(REFUSE, f"{variant.name} needs {variant.gpus} GPUs ({variant.instances} "
                            f"instance(s) x TP {variant.tensor_parallel_size} x DP "
                            f"{variant.data_parallel_size}); {gpu_source} lists {len(gpus)}"))
    if len({g.name for g in used}) > 1:
        say(Verdict(WARN, "the GPUs differ (" + ", ".join(sorted({g.name for g in used}))
                    + "): the slowest one sets the pace"))
    _compute_capability(variant, used, say)
    _memory(variant, used, plan, report, say)
    _interconnect(variant, used, hw, links, say)
    _profile_fit(report, plan, say)
    return report


def _compute_capability(variant: Variant, used: list[Gpu], say) -> None:
    low = min(used, key=lambda g: g.cc_number)
    c = variant.claims
    if c.activations == "fp8" and low.cc_number < 89:
        say(Verdict(REFUSE, f"{variant.name} claims FP8 W8A8, which needs compute capability "
                            f">= 8.9; the {low.name} has {low.cc_text}. vLLM would start without "
                            f"an error and run weight-only FP8 through the Marlin kernel (W8A16), "
                            f"so the result would not be FP8. Use an L4, L40S, H100 or H200."))
    elif c.min_compute_capability is not None and low.cc_number < round(
            c.min_compute_capability * 10):
        say(Verdict(REFUSE, f"{variant.name} needs compute capability >= "
                            f"{c.min_compute_capability}; the {low.name} has {low.cc_text}"))


def _memory(variant: Variant, used: list[Gpu], plan, report: PreflightReport, say) -> None:
    report.weights_gib = plan.weights_gib
    report.kv_bytes_per_token = plan.kv_bytes_per_token
    for error in plan.errors:
        say(Verdict(REFUSE, f"not enough memory: {error}"))
    if not plan.errors:
        report.available_kv_gib = plan.available_kv_gib
        report.kv_tokens = plan.kv_tokens
        report.max_concurrency = plan.max_concurrency
    kind, util = variant.kind, variant.memory_utilization
    for g in used:
        if g.memory_used_mib > g.memory_total_mib * (1 - util):
            say(Verdict(REFUSE, f"GPU {g.index} already has {g.memory_used_mib:,} MiB in use; "
                                f"{kind.label} wants {util:.0%} of {g.memory_total_mib:,} MiB and "
                                f"will refuse to start ({kind.memory_refusal}). Stop the other "
                                f"process or lower {kind.memory_utilization_flag}"))


def _interconnect(variant: Variant, used: list[Gpu], hw: HardwareSpec, links, say) -> None:
    if variant.tensor_parallel_size < 2 or len(used) < 2:
        return
    group = [g.index for g in used[:variant.tensor_parallel_size]]
    if links:
        nvlink = all_nvlink(links, group)
        source = "nvidia-smi topo -m"
    else:
        nvlink = hw.link_type == "nvlink"
        source = f"servers/hardware ({hw.name}: {hw.link_type})"
    if not nvlink:
        say(Verdict(WARN, f"tensor parallelism over GPUs {group} without NVLink (per {source}): "
                          f"every layer's all-reduces cross PCIe through NCCL (vLLM disables its "
                          f"custom all-reduce), so TP {variant.tensor_parallel_size} pays far more "
                          f"for communication than on NVLink; compare with dp2/two_instances"))


def _profile_fit(report: PreflightReport, plan, say) -> None:
    p = report.profile
    if p is None or not report.kv_tokens:
        return
    report.concurrency_at_profile = plan.concurrency_at(max(1, round(p.mean_tokens)))
    if p.max_tokens > report.max_model_len:
        say(Verdict(WARN, f"{p.share_over(report.max_model_len):.1%} of {p.name}'s requests are "
                          f"longer than max-model-len {report.max_model_len:,} (up to "
                          f"{p.max_tokens:,} tokens): the server rejects them with 400"))
    if p.peak_concurrency and p.peak_concurrency > report.concurrency_at_profile:
        say(Verdict(WARN, f"{p.name} goes up to {p.peak_concurrency} concurrent requests, but the "
                          f"KV cache holds about {report.concurrency_at_profile:.0f} of its mean "
                          f"length: above that requests wait or are preempted (watch "
                          f"num_requests_waiting and preemptions in the server timeline)"
                          + ("; shared prefixes, stored once by the prefix cache, stretch this"
                             if p.shared_prefix else "")))
    if p.peak_concurrency and report.max_num_seqs and p.peak_concurrency > report.max_num_seqs:
        say(Verdict(WARN, f"{p.name} goes up to {p.peak_concurrency} concurrent requests; "
                          f"max-num-seqs {report.max_num_seqs} caps the batch, the rest queue"))
