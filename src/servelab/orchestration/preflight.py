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
class LiveServer:
    """A server already up on the GPUs (``--url``, ``--backend external``): what its ``/metrics``
    says it uses (``vllm:cache_config_info``, one per engine), or nothing when it has none."""
    source: str
    memory_utilization: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    engines: int = 0

    @property
    def kv_tokens(self) -> int | None:
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    @classmethod
    def from_cache_configs(cls, source: str, configs: list[dict]) -> "LiveServer":
        def number(key: str, kind):
            try:
                return kind(configs[0][key])
            except (IndexError, KeyError, TypeError, ValueError):
                return None
        return cls(source, number("gpu_memory_utilization", float),
                   number("num_gpu_blocks", int), number("block_size", int), len(configs))

    def describe(self) -> str:
        if self.kv_tokens is None:
            return f"{self.source} (no vllm:cache_config_info: its KV cache is not known)"
        engines = f" per engine, {self.engines} engines" if self.engines > 1 else ""
        return (f"{self.source}: gpu_memory_utilization {self.memory_utilization:g}, "
                f"{self.num_gpu_blocks:,} blocks x {self.block_size} = {self.kv_tokens:,} KV "
                f"tokens{engines} (its /metrics)")


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
    server: LiveServer | None = None               # the server already up, when there is one

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
        data["server"] = dataclasses.asdict(self.server) if self.server else None
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
        if self.server is not None:
            lines.append(f"  server up         {self.server.describe()}")
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
                  profile: ProfileLengths | None = None,
                  server: LiveServer | None = None) -> PreflightReport:
    """``server``: the variant is already being served on these GPUs (its memory is the
    server's, not a reason to refuse); what it measured is compared with the estimate."""
    from servelab.sim.engine.kv_sizing import plan_kv_cache
    from servelab.specs.engine_config import build_kind_engine_config

    if not gpus:
        raise ServelabError(f"{gpu_source}: no GPUs listed")
    used = gpus[:variant.gpus]
    hw, known = spec_for_gpu(used[0])
    # The kind spells its settings its own way; the memory plan reads vLLM's (SGLang: its
    # --mem-fraction-static default depends on the GPU's memory).
    config = build_kind_engine_config(hw, variant.model, variant.serve_args, variant.kind,
                                      used[0].memory_total_mib)
    plan = plan_kv_cache(config)
    util = config.gpu_memory_utilization
    report = PreflightReport(variant=variant.name, gpus=gpus, gpu_source=gpu_source,
                             hardware=hw.name, model=variant.model, quant_path=config.quant.name,
                             kernel=config.quant.kernel, max_model_len=config.max_model_len,
                             max_num_seqs=config.max_num_seqs, profile=profile,
                             server=server)
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
    _memory(variant, used, plan, report, say, util)
    _interconnect(variant, used, hw, links, say)
    _profile_fit(report, plan, say)
    if known:
        from servelab.sim.engine.costs import resolve_cost

        say(Verdict(OK, f"speed estimates (predict, sim) use the cost model from "
                        f"{resolve_cost(config)[1]}"))
    return report


def _compute_capability(variant: Variant, used: list[Gpu], say) -> None:
    low = min(used, key=lambda g: g.cc_number)
    c = variant.claims
    if c.activations == "fp8" and low.cc_number < 89:
        say(Verdict(REFUSE, f"{variant.name} claims FP8 W8A8, which needs compute capability "
                            f">= 8.9; the {low.name} has {low.cc_text}. {variant.kind.label} would "
                            f"start without "
                            f"an error and run weight-only FP8 through the Marlin kernel (W8A16), "
                            f"so the result would not be FP8. Use an L4, L40S, H100 or H200."))
    elif c.min_compute_capability is not None and low.cc_number < round(
            c.min_compute_capability * 10):
        say(Verdict(REFUSE, f"{variant.name} needs compute capability >= "
                            f"{c.min_compute_capability}; the {low.name} has {low.cc_text}"))


def _memory(variant: Variant, used: list[Gpu], plan, report: PreflightReport, say,
            util: float | None = None) -> None:
    report.weights_gib = plan.weights_gib
    report.kv_bytes_per_token = plan.kv_bytes_per_token
    for error in plan.errors:
        say(Verdict(REFUSE, f"not enough memory: {error}"))
    if not plan.errors:
        report.available_kv_gib = plan.available_kv_gib
        report.kv_tokens = plan.kv_tokens
        report.max_concurrency = plan.max_concurrency
    kind, util = variant.kind, variant.memory_utilization if util is None else util
    if report.server is not None:
        _server_up(variant, used, report, say)
        return
    if kind.memory_from_free:
        _memory_from_free(variant, used, plan, util, say)
        return
    for g in used:
        if g.memory_used_mib > g.memory_total_mib * (1 - util):
            say(Verdict(REFUSE, f"GPU {g.index} already has {g.memory_used_mib:,} MiB in use "
                                f"(measured by {report.gpu_source}); {kind.label} wants "
                                f"{util:.0%} of {g.memory_total_mib:,} MiB and will refuse to "
                                f"start ({kind.memory_refusal}). This applies when a new server "
                                f"starts on this GPU: stop the other process or lower "
                                f"{kind.memory_utilization_flag}; if that memory is the server "
                                f"you mean to measure, give its URL (`servelab preflight "
                                f"{variant.name} --url URL`, --backend external)"))


def _memory_from_free(variant: Variant, used: list[Gpu], plan, util: float, say) -> None:
    """SGLang's KV pool is free memory at start x --mem-fraction-static - weights: memory in use
    shrinks it rather than refusing to start."""
    for g in (g for g in used if g.memory_used_mib and not plan.errors):
        free_gib = (g.memory_total_mib - g.memory_used_mib) / 1024
        kv_gib, used_text = free_gib * util - plan.weights_gib, f"{g.memory_used_mib:,} MiB in use"
        say(Verdict(REFUSE, f"GPU {g.index} has {used_text}: {util:g} of the {free_gib:.1f} GiB "
                            f"left does not hold the {plan.weights_gib:.1f} GiB of weights "
                            f"({variant.kind.memory_refusal}); stop the other process")
            if kv_gib <= 0 else
            Verdict(WARN, f"GPU {g.index} has {used_text}: {variant.kind.label} sizes its KV cache "
                          f"from free memory, so it gets about {kv_gib:.1f} GiB instead of "
                          f"{plan.available_kv_gib:.1f} GiB"))


def _server_up(variant: Variant, used: list[Gpu], report: PreflightReport, say) -> None:
    """The GPUs hold the server under test: report what it uses, compare it with the estimate."""
    server, kind = report.server, variant.kind
    in_use = ", ".join(f"GPU {g.index} {g.memory_used_mib:,} of {g.memory_total_mib:,} MiB"
                       for g in used)
    say(Verdict(OK, f"memory in use ({in_use}, per {report.gpu_source}) is taken as the server "
                    f"under test, {server.describe()}; the refusal for memory in use applies "
                    f"only to starting a new server on these GPUs"))
    if server.memory_utilization is not None and abs(
            server.memory_utilization - variant.memory_utilization) > 0.005:
        say(Verdict(WARN, f"the server runs with {kind.memory_utilization_flag} "
                          f"{server.memory_utilization:g}; {variant.name} says "
                          f"{variant.memory_utilization:g} (its KV cache differs from the "
                          f"variant's)"))
    if server.kv_tokens and report.kv_tokens:
        ratio = server.kv_tokens / report.kv_tokens
        if not 0.75 <= ratio <= 1.33:
            say(Verdict(WARN, f"the server has {server.kv_tokens:,} KV tokens per engine, "
                              f"{ratio:.2f}x the estimate {report.kv_tokens:,}: other flags, "
                              f"another model, or another process on the GPU"))


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
