"""The foreground simulated server behind ``servelab sim``: vLLM's start-up log, then serving
until SIGINT/SIGTERM, with vLLM's periodic engine stats lines and a ready file for the parent.

Exit codes follow vLLM's: 1 when the engine cannot start (the model or its KV cache does not fit;
vLLM's error line on stderr), 0 after a clean shutdown.
"""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from dataclasses import dataclass

from servelab.core.procs import write_ready_file
from servelab.sim.engine.costs import resolve_cost
from servelab.sim.engine.kv_sizing import plan_kv_cache
from servelab.sim.engine.startup_log import dialect
from servelab.sim.server.iteration_log import attach as attach_iteration_log
from servelab.sim.server.pd import connector_lines
from servelab.sim.server.server import SimServer, new_event_loop
from servelab.specs.engine_config import EngineConfig
from servelab.specs.pd import PDSpec


@dataclass
class ServeOptions:
    """How ``servelab sim`` serves (its flags other than the engine's configuration)."""
    host: str = "127.0.0.1"
    port: int = 8000
    seed: int = 0
    faults: str | None = None
    output_divergence: float | None = None
    timer_guard_ms: float = 1.0
    log_stats_interval: float = 5.0
    ready_file: str | None = None
    api_keys: tuple[str, ...] = ()     # --api-key (else $VLLM_API_KEY); never logged
    iteration_details: bool = False    # --enable-logging-iteration-details (vLLM's lines)
    vllm_version: str | None = None    # --vllm-version: the release the log and /metrics imitate


def _vllm_error_line(message: str) -> str:
    # vLLM dies with a traceback ending in the exception; the OOM message already names its type.
    return message if message.startswith("torch.") else f"ValueError: {message}"


async def log_stats(server: SimServer, interval_s: float = 5.0, write=print) -> None:
    """vLLM's periodic engine log line, per engine, while there is traffic."""
    last = [(m.prompt_tokens, m.generation_tokens) for m in server.frontend]
    while True:
        await asyncio.sleep(interval_s)
        for i, (engine, m) in enumerate(zip(server.engines, server.frontend)):
            p0, g0 = last[i]
            last[i] = (m.prompt_tokens, m.generation_tokens)
            s = engine.stats
            if m.prompt_tokens == p0 and m.generation_tokens == g0 and not s.num_running:
                continue
            q, h = s.prefix_cache_queries_total, s.prefix_cache_hits_total
            prompt = (m.prompt_tokens - p0) / interval_s
            gen = (m.generation_tokens - g0) / interval_s
            write(f"Engine {i:03d}: Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation "
                  f"throughput: {gen:.1f} tokens/s, Running: {s.num_running} reqs, Waiting: "
                  f"{s.num_waiting} reqs, GPU KV cache usage: {100 * s.kv_usage:.1f}%, Prefix "
                  f"cache hit rate: {100 * h / q if q else 0.0:.1f}%, simulator lag (last step): "
                  f"{1e3 * m.lag_last:.2f} ms")




def serve(config: EngineConfig, instances: int | PDSpec, salt: str | None,
          opts: ServeOptions) -> int:
    """Print the start-up log (in the dialect of the variant's server kind), serve until a
    signal, shut down; the exit code. A PD variant (``instances`` a ``PDSpec``) prints every
    instance's start-up, each line prefixed ``prefill-0 | `` or ``decode-0 | `` as
    ``docker compose logs`` prefixes a service's."""
    speaks = dialect(config)

    def log(line: str, instance: str | None = None) -> None:
        prefix = "" if instance is None else f"{instance} | "
        print(prefix + speaks.format_line(line), flush=True)

    plan = _log_startup(config, instances, speaks, opts, log)
    if plan.errors:
        print(_vllm_error_line(plan.errors[0]), file=sys.stderr, flush=True)
        return 1
    server = _build_server(config, instances, salt, opts, log)
    iterations = attach_iteration_log(server) if opts.iteration_details else None
    gc.freeze()  # start-up objects (corpus, tokenizer tables) stay out of later GC passes
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stats_task = None
    try:
        url = loop.run_until_complete(server.start(opts.host, opts.port))
        _announce(server, url, config, speaks, opts, log)
        if opts.ready_file:
            write_ready_file(opts.ready_file, url)
        if opts.log_stats_interval > 0:
            stats_task = loop.create_task(log_stats(server, opts.log_stats_interval, log))
        loop.run_until_complete(stop.wait())
        log("Shutting down")
    finally:
        if stats_task is not None:
            stats_task.cancel()
        loop.run_until_complete(server.stop())
        if iterations is not None:
            iterations.flush()
        loop.close()
        if opts.ready_file and os.path.exists(opts.ready_file):
            os.remove(opts.ready_file)
    return 0


def _log_startup(config: EngineConfig, instances: int | PDSpec, speaks, opts: ServeOptions,
                 log):
    """servelab's two lines, then the kind's start-up lines (once per instance for PD); the KV
    cache plan they were written from (its errors end the start-up as vLLM's would)."""
    pd = instances if isinstance(instances, PDSpec) else None
    names = [] if pd is None else [f"{pd.role(i)}-{pd.index_in_role(i)}"
                                   for i in range(pd.prefill + pd.decode)]
    shown = instances if pd is None else f"{len(names)} ({pd.prefill} prefill + {pd.decode} decode)"
    log(f"servelab sim: {config.model.hf_id} on {config.hardware.name} "
        f"(TP={config.tensor_parallel_size}, DP={config.data_parallel_size}, "
        f"instances={shown}, kernel path {config.quant.name})")
    log(f"servelab sim: cost model from {resolve_cost(config)[1]}")
    plan = plan_kv_cache(config)
    lines = speaks.startup_lines(config, plan, opts.seed, opts.vllm_version)
    for line in lines if pd is None else ():
        log(line)
    for i, name in enumerate(names):
        for line in lines + connector_lines(pd, i, opts.seed):
            log(line, name)
    return plan


def _build_server(config: EngineConfig, instances: int | PDSpec, salt: str | None,
                  opts: ServeOptions, log) -> SimServer:
    server = SimServer(config, seed=opts.seed, faults=opts.faults, instances=instances,
                       output_divergence=opts.output_divergence, divergence_salt=salt,
                       guard_s=max(opts.timer_guard_ms, 0.0) / 1000.0,
                       api_keys=list(opts.api_keys), log=log)
    if opts.vllm_version:
        pd_pages = [i.exporter for i in server.pd.instances] if server.pd is not None else []
        for exporter in [server.exporter, *pd_pages]:
            exporter.imitate(opts.vllm_version)
    if server.dev_mode:
        log("WARNING SECURITY WARNING: Development endpoints are enabled! This should NOT be used "
            "in production!")
    return server


def _announce(server: SimServer, url: str, config: EngineConfig, speaks, opts: ServeOptions,
              log) -> None:
    """The lines once the server listens: where, with what, and the kind's ready line."""
    log(f"Serving {', '.join(server.served.names)} at {url} (max_model_len "
        f"{config.max_model_len}; {len(server.engines)} engine(s))")
    if server.api_keys:
        log(f"API key authentication on /v1, /v2, /inference, /cohere "
            f"({len(server.api_keys)} key(s))")
    if server.fault_plan.spec.enabled:
        log(f"Fault injection: {opts.faults}")
    if server.pd is not None:
        for inst in server.pd.instances:
            log(f"servelab sim: {inst.role} instance (engine {inst.driver.index}) serves "
                f"/metrics and /health at {inst.url}", inst.name)
            if speaks.ready_line:
                log(speaks.ready_line, inst.name)
        log(f"servelab sim: {url} is the proxy (vLLM's toy_proxy_server.py): one OpenAI "
            f"endpoint, no /metrics")
    if speaks.ready_line:
        log(speaks.ready_line)
