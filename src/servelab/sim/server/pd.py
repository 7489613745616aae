"""A prefill/decode-disaggregated variant served over HTTP, as behind vLLM's toy proxy.

The simulator's URL is the proxy's: one OpenAI endpoint. Each request takes the proxy's two legs
(``specs.pd``, ``sim.engine.disagg`` for the same model in virtual time):

1. one hop (``ROUTER_HOP_S``), then the prefill engine with the fewest outstanding requests runs
   it with ``max_tokens`` 1; that token never reaches the client (the proxy reads the
   non-streamed answer only for its ``kv_transfer_params``);
2. the response headers go out (the toy proxy opens its stream only after the prefill answer),
   then ``disagg.handoff_s`` passes (the prefill answer out, the hop to a decode instance, the
   KV read over ``kv_transfer.KVLink``: the one definition predict waits too), plus one more
   hop that stands for the proxy relaying every chunk: a constant delay on each chunk is the
   same as starting the decode one hop later, apart from batching with other requests;
3. the least loaded decode engine, holding every prompt token but the last
   (``disagg.RemoteKVBlockManager``), streams all the output tokens.

``/metrics`` at the proxy's URL answers 404, as the toy proxy has none: the load generator's
scrape records ``absent``, as against a real PD deployment. Each instance has its own port with
its own ``/metrics`` (engine "0", its role's counters, NIXL's transfer families on the decode
side) and ``/health``, printed at start-up, as the real instances' ports are: ``servelab verify
--variant pd_1p1d --url PREFILL,DECODE`` reads them. An instance's TTFT, queue and E2E
histograms count from when that instance got the request, as a real one's do; ``/sim/requests``
keeps the client's view (arrival at the proxy).
"""
from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client.metrics_core import Metric

from servelab.sim.engine.disagg import ROUTER_HOP_S, handoff_s
from servelab.sim.engine.kv_transfer import KVLink
from servelab.sim.server.metrics import MetricsExporter, SimCollector
from servelab.sim.server.realtime import EngineDriver, pick_driver
from servelab.sim.server.stream import RequestStream, ServerRecord, clock
from servelab.specs.pd import PDSpec

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class NixlStats:
    """What one instance's NixlConnector counts (vLLM's ``NixlPromMetrics``): the KV reads made
    by its decode side (seconds, bytes); failed transfers and expired requests stay 0, since
    the simulated link never fails."""

    __slots__ = ("transfers", "time_s", "bytes", "failed", "expired")

    def __init__(self):
        self.transfers, self.time_s, self.bytes, self.failed, self.expired = 0, 0.0, 0.0, 0, 0


class InstanceCollector(SimCollector):
    """One PD instance's page: vLLM's families for its one engine, then NIXL's. The NIXL
    histograms go out with the +Inf bucket only: their count and sum are what
    ``specs.pd.read_connector_metrics`` reads; NIXL's bucket bounds are not modelled."""

    def __init__(self, *args, nixl: NixlStats, **kwargs):
        super().__init__(*args, **kwargs)
        self.nixl = nixl

    def collect(self):
        yield from super().collect()
        n, base = self.nixl, self._base(0)
        for name, doc, total in (
                ("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV "
                 "Cache transfers.", n.time_s),
                ("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV "
                 "Cache transfers.", n.bytes)):
            m = Metric(name, doc, "histogram")
            m.add_sample(name + "_bucket", {**base, "le": "+Inf"}, float(n.transfers))
            m.add_sample(name + "_count", base, float(n.transfers))
            m.add_sample(name + "_sum", base, float(total))
            yield m
        yield self._counter("vllm:nixl_num_failed_transfers",
                            "Number of failed NIXL KV Cache transfers.", [n.failed])
        yield self._counter("vllm:nixl_num_kv_expired_reqs",
                            "Number of requests that had their KV expire.", [n.expired])


class Instance:
    """One ``vllm serve`` of the variant: its role, driver, counters and page."""

    def __init__(self, spec: PDSpec, index: int, driver: EngineDriver, exporter_args: tuple):
        self.role = spec.role(index)
        self.name = f"{self.role}-{spec.index_in_role(index)}"
        self.driver = driver
        self.nixl = NixlStats()
        self.http_requests: dict[tuple[str, str, str], int] = {}
        name, cache_info, spec_k = exporter_args
        self.exporter = MetricsExporter(InstanceCollector(
            name, [driver.engine], [driver.metrics], cache_info, spec_k, self.http_requests,
            nixl=self.nixl))
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    def count(self, handler: str) -> None:
        """The proxy's request on this instance, as its instrumentator counts it."""
        key = (handler, "POST", "2xx")
        self.http_requests[key] = self.http_requests.get(key, 0) + 1

    async def start(self, host: str, listen) -> None:
        async def metrics(request):
            return web.Response(body=self.exporter.render(),
                                headers={"Content-Type": PROMETHEUS_TEXT})

        async def health(request):
            return web.Response(status=503 if self.driver.dead else 200)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = listen(host, 0)
        await web.SockSite(self._runner, sock).start()
        shown = host if ":" not in host else f"[{host}]"
        self.url = f"http://{shown}:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class PDRouter:
    """The proxy: the prefill leg, the handoff, the decode engine's choice."""

    def __init__(self, spec: PDSpec, drivers: list[EngineDriver], link: KVLink,
                 exporter_args: tuple, hop_s: float = ROUTER_HOP_S):
        self.spec = spec
        self.link = link
        self.hop_s = hop_s
        self.instances = [Instance(spec, i, d, exporter_args) for i, d in enumerate(drivers)]
        self.prefill = [i.driver for i in self.instances[:spec.prefill]]
        self.decode = [i.driver for i in self.instances[spec.prefill:]]
        self.client_arrival: dict[str, float] = {}   # engine id -> arrival at the proxy

    async def run_prefill(self, stream: RequestStream, prompt_ids, handler: str) -> bool:
        """The first leg; False when no prefill engine is alive. Cancelling it (the client
        went away) aborts the prefill request."""
        await asyncio.sleep(self.hop_s)
        driver = pick_driver(self.prefill)
        if driver is None:
            return False
        rec = stream.record
        leg = RequestStream(
            ServerRecord(rec.request_id, rec.kind, rec.model, clock(), False, len(prompt_ids), 1,
                         engine_id=rec.engine_id + "-prefill"),
            stream.text, None, stream.token_json, driver.metrics, False, False, stream.loop)
        self.instances[driver.index].count(handler)
        driver.submit(leg, prompt_ids, 1, 0, True, None, None)
        try:
            await leg.done
        except asyncio.CancelledError:
            leg.cancel(clock())
            raise
        return leg.record.error is None

    async def hand_off(self, stream: RequestStream, num_prompt: int,
                       handler: str) -> EngineDriver | None:
        """Wait out the handoff, then pick the decode engine and mark the request's KV as
        arrived there; the stream's record takes the decode instance's arrival time (put back
        by ``restore_arrival`` when it finishes)."""
        wait = handoff_s(self.link, num_prompt, self.hop_s)
        transfer = self.link.transfer_s(num_prompt)
        got = clock() + wait - transfer   # the decode instance has the request; the read starts
        await asyncio.sleep(wait + self.hop_s)
        driver = pick_driver(self.decode)
        if driver is None:
            return None
        inst = self.instances[driver.index]
        inst.count(handler)
        inst.nixl.transfers += 1
        inst.nixl.time_s += transfer
        inst.nixl.bytes += self.link.transfer_bytes(num_prompt)
        rec = stream.record
        self.client_arrival[rec.engine_id] = rec.arrival
        rec.arrival = got
        stream.metrics = driver.metrics
        driver.engine.block_manager.remote.add(rec.engine_id)
        return driver

    def restore_arrival(self, driver: EngineDriver, rec: ServerRecord) -> None:
        driver.engine.block_manager.remote.discard(rec.engine_id)
        arrival = self.client_arrival.pop(rec.engine_id, None)
        if arrival is not None:
            rec.arrival = arrival

    async def start(self, host: str, listen) -> None:
        for inst in self.instances:
            await inst.start(host, listen)

    async def stop(self) -> None:
        for inst in self.instances:
            await inst.stop()


def connector_lines(spec: PDSpec, index: int, seed: int = 0) -> list[str]:
    """What instance ``index``'s start-up says of its connector, in vLLM's words (the lines
    ``specs.pd.read_connector_log`` reads): the factory once per side, then NIXL's start-up."""
    import uuid

    engine_id = str(uuid.UUID(int=(seed << 16 | index) + 1, version=4))
    created = f"Creating v1 connector with name: {spec.kv_connector} and engine_id: {engine_id}"
    return [created, f"Initializing NIXL Scheduler {engine_id}", created,
            "Initializing NIXL wrapper", f"Initializing NIXL worker {engine_id}"]
