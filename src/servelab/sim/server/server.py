"""The simulated vLLM server: engines driven in real time behind vLLM's OpenAI-compatible API.

Programmatic use::

    server = build_server(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct",
                          serve_args=["--max-model-len", "4096"], seed=0)
    async with server.serving("127.0.0.1", 0) as url: ...          # inside a running loop
    with start_background(hardware="H100", ...) as bg: bg.url      # from synchronous code

``servelab sim`` (``servelab.commands.sim``, running ``serve.serve``) is the command-line front.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web

from servelab.core.errors import ServelabError
from servelab.core.timeouts import SIM_READY_S, STOP_GRACE_S
from servelab.sim.engine.balancer import make_engines
from servelab.sim.engine.disagg import make_pd_engines
from servelab.sim.engine.kv_transfer import kv_link
from servelab.sim.server.auth import authentication, configured_keys
from servelab.sim.server.faults import FaultPlan, parse_faults
from servelab.sim.server.metrics import EngineMetrics, MetricsExporter, SimCollector
from servelab.sim.server.openai_api import SIM, add_routes, count_http_requests
from servelab.sim.server.pd import PDRouter
from servelab.sim.server.protocol import ServedModel, SimRequest
from servelab.sim.server.realtime import EngineDriver
from servelab.sim.server import otlp_export
from servelab.sim.server.stream import ServerRecord, clock
from servelab.sim.server.spec_hint import acceptance_hint, equivalent_acceptance
from servelab.sim.server.textgen import OutputText, get_corpus, request_key
from servelab.sim.server.tokenizer import get_tokenizer
from servelab.specs.engine_config import EngineConfig, build_kind_engine_config
from servelab.specs.pd import PDSpec
from servelab.specs.server_kinds import server_kind

DEFAULT_HARDWARE = "L40S"
DEFAULT_MODEL = "Qwen/Qwen2.5-7B-Instruct"
# Output divergence from the BF16 baseline per token position, by kernel path (an assumption to
# make fidelity comparisons non-trivial; --output-divergence overrides it).
DEFAULT_DIVERGENCE = {"bf16": 0.0, "fp8-w8a8": 0.002, "fp8-w8a16-marlin": 0.002,
                      "w4a16-marlin": 0.005, "awq-gemm": 0.005, "gptq-exllama": 0.005}
FP8_KV_DIVERGENCE = 0.001
INLINE_TOKENIZE_CHARS = 1024


def server_dev_mode(environ=os.environ) -> bool:
    """vLLM's ``VLLM_SERVER_DEV_MODE`` (an integer; non-zero turns development endpoints on)."""
    value = environ.get("VLLM_SERVER_DEV_MODE", "0").strip() or "0"
    try:
        return bool(int(value))
    except ValueError:
        raise ServelabError(f"VLLM_SERVER_DEV_MODE: found {value!r}; allowed 0 or 1") from None


def default_divergence(config: EngineConfig) -> float:
    d = DEFAULT_DIVERGENCE.get(config.quant.name, 0.005)
    if config.kv_cache_dtype.startswith("fp8"):
        d += FP8_KV_DIVERGENCE
    return d


class SimServer:
    """Engines, their real-time drivers, and everything the HTTP handlers share."""

    def __init__(self, config: EngineConfig, *, seed: int = 0, faults: str | None = None,
                 instances: int | PDSpec = 1, output_divergence: float | None = None,
                 divergence_salt: str | None = None, guard_s: float = 0.001,
                 resync_after_s: float = 0.05, max_records: int = 200_000,
                 dev_mode: bool | None = None, api_keys=None, log=None):
        if output_divergence is not None and not 0.0 <= output_divergence < 1.0:
            raise ServelabError(f"--output-divergence: found {output_divergence}; allowed "
                                "0 <= d < 1 (probability per output token)")
        self.config = config
        self.seed = seed
        self.fault_plan = FaultPlan(parse_faults(faults), seed)
        # A PD variant's instances are two pools behind a proxy (``pd``); others are like engines.
        pd = instances if isinstance(instances, PDSpec) else None
        self.engines = (make_engines(config, seed, count=config.data_parallel_size * instances)
                        if pd is None else make_pd_engines(config, pd.prefill, pd.decode, seed))
        self.startup_log = list(self.engines[0].startup_log)
        self.tokenizer = get_tokenizer()
        self.corpus = get_corpus()
        self.served = ServedModel(list(config.served_model_names), config.max_model_len,
                                  config.model.hf_id)
        self.prompt_tokens_details = config.serve_args.enable_prompt_tokens_details
        self.force_include_usage = "--enable-force-include-usage" in config.serve_args.ignored
        self.divergence = (default_divergence(config) if output_divergence is None
                           else output_divergence)
        self.divergence_salt = divergence_salt or f"{config.quant.name}/{config.kv_cache_dtype}"
        self._sample_rng = random.Random(f"servelab-sampling-{seed}")
        self.spec_method = config.speculative.method if config.speculative else None
        self.spec_base = (equivalent_acceptance(self.engines[0].spec.acceptance)
                          if config.speculative else None)
        self.frontend = [EngineMetrics(config.max_model_len) for _ in self.engines]
        # A prefill leg is the proxy's own request: counted on its instance, never a record.
        self.drivers = [EngineDriver(e, m, self._on_prefill_finished
                                     if pd is not None and i < pd.prefill else self._on_finished,
                                     guard_s, resync_after_s)
                        for i, (e, m) in enumerate(zip(self.engines, self.frontend))]
        self.http_requests: dict[tuple[str, str, str], int] = {}  # (handler, method, "2xx")
        self.kind = server_kind(config.server_kind)
        self._expose_metrics(config, pd)
        self.records: list[ServerRecord] = []
        self._next_seq = 1
        self.max_records = max_records
        self.created = int(time.time())
        self.epoch_offset = time.time() - clock()
        self.spans = otlp_export.start(config.serve_args.ignored, self.epoch_offset)
        self._tokenize_pool = ThreadPoolExecutor(2, thread_name_prefix="servelab-tokenize")
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        # vLLM serves its development endpoints (/reset_prefix_cache) only with
        # VLLM_SERVER_DEV_MODE=1; so does the simulator.
        self.dev_mode = server_dev_mode() if dev_mode is None else dev_mode
        # vLLM's --api-key (or VLLM_API_KEY): 401 on its guarded routes without the key.
        self.api_keys = configured_keys(api_keys, config.serve_args.ignored)
        self.log = log or (lambda line: None)

    def _expose_metrics(self, config: EngineConfig, pd: PDSpec | None) -> None:
        """/metrics: vLLM's families from the engines' and frontend's numbers, in the kind's
        dialect; a PD variant's instances each serve their own (``PDRouter``)."""
        cache_info = {
            "block_size": str(config.block_size), "cache_dtype": config.kv_cache_dtype,
            "enable_prefix_caching": str(config.enable_prefix_caching),
            "gpu_memory_utilization": str(config.gpu_memory_utilization),
            "num_cpu_blocks": "None", "swap_space": "4", "is_attention_free": "False",
            "sliding_window": "None",
        }
        collector = SimCollector(config.served_model_name, self.engines, self.frontend,
                                 cache_info, config.num_speculative_tokens, self.http_requests)
        # A kind with its own /metrics writes it from the same numbers (ServerKind.sim_metrics).
        page = self.kind.sim_metrics(collector) if self.kind.sim_metrics else collector
        self.exporter = MetricsExporter(page)
        self.pd = None if pd is None else PDRouter(
            pd, self.drivers, kv_link(config, pd.kv_link_gb_s),
            (config.served_model_name, cache_info, config.num_speculative_tokens))

    # -- per request ---------------------------------------------------------------------------
    async def encode(self, text: str) -> list[int]:
        """Tokenize; a long text goes to a thread (the tokenizer releases the GIL in batch mode)
        so that the engine drivers on the event loop are not held up (~1 us per character)."""
        if len(text) < INLINE_TOKENIZE_CHARS:
            return self.tokenizer.encode(text)
        loop = asyncio.get_running_loop()
        (ids,) = await loop.run_in_executor(self._tokenize_pool, self.tokenizer.encode_batch,
                                            [text])
        return ids

    def output_text(self, sreq: SimRequest) -> tuple[OutputText, int | None]:
        """The request's output tokens and, unless ignore_eos, where the "model" emits EOS."""
        if sreq.seed is not None:
            sample_seed = None if sreq.temperature == 0 else sreq.seed
        else:
            # greedy is deterministic; sampling without a seed differs request to request
            sample_seed = None if sreq.temperature == 0 else self._sample_rng.getrandbits(62)
        key = request_key(sreq.prompt_ids, sample_seed)
        tok = self.tokenizer
        eos_id = tok.im_end_id if sreq.kind == "chat" else tok.endoftext_id
        text = OutputText(self.corpus, key, sreq.max_tokens, divergence=self.divergence,
                          salt=self.divergence_salt, eos_id=eos_id)
        eos_after = None if sreq.ignore_eos else text.natural_stop(key, sreq.min_tokens)
        return text, eos_after

    def spec_acceptance_hint(self, prompt_ids) -> float | None:
        """Speculative acceptance from the prompt (``spec_hint``): low on random token soup, the
        method's default on prose, higher for prompt lookup on text that repeats itself."""
        if self.spec_method is None:
            return None
        return acceptance_hint(self.spec_method, prompt_ids, self.tokenizer.vocab_size,
                               self.spec_base)

    def _on_prefill_finished(self, driver: EngineDriver, stream, seq) -> None:
        self._observe(driver, stream.record, seq)

    def _on_finished(self, driver: EngineDriver, stream, seq) -> None:
        rec = stream.record
        self._observe(driver, rec, seq)
        if self.pd is not None:
            self.pd.restore_arrival(driver, rec)
        if self.spans is not None:
            self.spans.record(rec, seq)
        self.add_record(rec)

    def _observe(self, driver: EngineDriver, rec: ServerRecord, seq) -> None:
        reason = rec.finish_reason or "abort"
        last = rec.chunk_times[-1] if rec.chunk_times else (rec.finished or clock())
        driver.metrics.observe_finished(
            arrival=rec.arrival, first_token=rec.first_token, last_token=last,
            num_prompt=rec.prompt_tokens, num_output=rec.output_tokens,
            num_cached=rec.cached_tokens, max_tokens=rec.max_tokens, reason=reason,
            scheduled=getattr(seq, "first_scheduled_time", None),
            engine_first_token=getattr(seq, "first_token_time", None),
            engine_last_token=getattr(seq, "last_token_time", None))

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Reset every engine's prefix cache, logging vLLM's lines; True if all of them did."""
        self.log("Resetting prefix cache...")
        ok = True
        for engine in self.engines:
            if engine.reset_prefix_cache(reset_running_requests):
                self.log("Successfully reset prefix cache")
            else:
                ok = False
                self.log(f"WARNING Failed to reset prefix cache because some blocks "
                         f"({engine.block_manager.num_used_blocks}) are not freed yet")
        return ok

    def add_record(self, rec: ServerRecord) -> None:
        rec.seq = self._next_seq
        self._next_seq += 1
        self.records.append(rec)
        if len(self.records) > self.max_records:
            del self.records[: len(self.records) // 4]

    def records_after(self, cursor: int) -> list[ServerRecord]:
        if not self.records:
            return []
        first = self.records[0].seq
        return self.records[max(0, cursor + 1 - first):]

    # -- serving -------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        check = authentication(self.api_keys)
        middlewares = [count_http_requests] + ([check] if check else [])
        app = web.Application(client_max_size=64 << 20, middlewares=middlewares)
        app[SIM] = self
        add_routes(app)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> str:
        """Start the drivers and listen; returns the base URL (``port=0`` picks a free port)."""
        for d in self.drivers:
            d.start()
        if self.pd is not None:
            await self.pd.start(host, _listening_socket)
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True,
                                     access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = _listening_socket(host, port)
        await web.SockSite(self._runner, sock, backlog=4096).start()
        bound = sock.getsockname()[1]  # the chosen port when port=0
        shown = host if ":" not in host else f"[{host}]"
        self.url = f"http://{shown}:{bound}"
        return self.url

    async def stop(self) -> None:
        for d in self.drivers:
            await d.stop()
        if self.pd is not None:
            await self.pd.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._tokenize_pool.shutdown(wait=False)
        if self.spans is not None:
            self.spans.close()

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0):
        url = await self.start(host, port)
        try:
            yield url
        finally:
            await self.stop()


def _listening_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ServelabError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port "
                            "(0 picks a free one)") from None
    return sock


def resolve_config(hardware: str | None = None, model: str | None = None, serve_args=(), *,
                   variant: str | None = None, instances: int | None = None,
                   ) -> tuple[EngineConfig, int | PDSpec, str | None]:
    """(engine config, instances, divergence salt) from a hardware name, a model (HF id) and
    ``vllm serve`` flags, or a variant file whose model, serve_args and instances are used
    (explicit arguments win; ``serve_args`` go after the variant's, so they override it, in
    the variant's server kind's spelling: SGLang's flags for an SGLang variant). A PD variant's
    instances come back as its ``PDSpec``: the split into prefill and decode instances."""
    args = list(serve_args)
    salt = None
    kind = server_kind()
    pd = None
    if variant is not None:
        from servelab.specs.variants import load_variant

        v = load_variant(variant)
        model = model or v.model
        args = list(v.serve_args) + args
        instances = instances or v.instances
        salt = v.name
        kind = v.kind
        pd = v.pd
    config = build_kind_engine_config(hardware or DEFAULT_HARDWARE, model or DEFAULT_MODEL, args,
                                      kind)
    if pd is not None:
        if instances not in (None, pd.prefill + pd.decode):
            raise ServelabError(f"--instances {instances}: {variant} has {pd.prefill} prefill + "
                                f"{pd.decode} decode instances (its pd: block); drop --instances "
                                f"or change the block")
        return config, pd, salt
    if config.serve_args.kv_transfer_config is not None:
        # Serving it as plain engines would show colocated latency under a PD-looking config.
        raise ServelabError(
            f"{variant or 'serve args'}: --kv-transfer-config needs a variant with a `pd:` block "
            f"(servers/variants/pd_1p1d.yaml), which says which instances prefill and which "
            f"decode; the simulator serves such a variant behind its proxy (docs/variants.md, PD)")
    return config, instances or 1, salt


def build_server(hardware: str | None = None, model: str | None = None, serve_args=(), *,
                 variant: str | None = None, seed: int = 0, faults: str | None = None,
                 instances: int | None = None, output_divergence: float | None = None,
                 **options) -> SimServer:
    """A SimServer (see resolve_config). Raises ServelabError; EngineStartupError, with vLLM's
    message, when the model does not fit."""
    config, instances, salt = resolve_config(hardware, model, serve_args, variant=variant,
                                             instances=instances)
    return SimServer(config, seed=seed, faults=faults, instances=instances,
                     output_divergence=output_divergence, divergence_salt=salt, **options)


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows; asyncio's loop works, with coarser timers
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@dataclass
class BackgroundServer:
    """A SimServer serving on its own event loop in a daemon thread."""

    server: SimServer
    url: str
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(STOP_GRACE_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_GRACE_S)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_background(host: str = "127.0.0.1", port: int = 0, **build_kwargs) -> BackgroundServer:
    """Build and start a server on a background thread; ``build_kwargs`` go to build_server."""
    server = build_server(**build_kwargs)
    loop = new_event_loop()
    ready: dict = {}
    started = threading.Event()

    def run():
        asyncio.set_event_loop(loop)
        try:
            ready["url"] = loop.run_until_complete(server.start(host, port))
        except BaseException as exc:  # reported to the caller below
            ready["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name="servelab-sim", daemon=True)
    thread.start()
    started.wait(SIM_READY_S)
    if "error" in ready:
        raise ready["error"]
    return BackgroundServer(server, ready["url"], loop, thread)
