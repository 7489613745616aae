"""``servelab sim --variant pd_1p1d`` as a process: the proxy's endpoint streams each request from
the decode engine after the prefill engine's leg and the KV transfer, so the same request's TTFT
exceeds a colocated server's by the handoff; the proxy has no /metrics, each instance its own."""
import re
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from servelab.core.procs import spawn
from servelab.core.timeouts import HTTP_PROBE_S, SIM_READY_S
from servelab.sim.engine.disagg import ROUTER_HOP_S, handoff_s
from servelab.sim.engine.kv_transfer import kv_link
from servelab.sim.server.server import resolve_config, start_background
from servelab.specs.pd import read_connector_log, read_connector_metrics

from sim_server_helpers import sse

SMALL = "Qwen/Qwen2.5-0.5B-Instruct"   # fast steps; the variant's 7B would take seconds here
ARGS = ["--hardware", "L4", "--model", SMALL]  # L4: a PCIe link, so the KV read takes ms
PROMPT, OUT, REPEATS = 6000, 6, 3


def _ttft_and_usage(url: str, ids: list[int]):
    import time

    sent = time.time()
    res = sse(url, "/v1/completions", {"model": SMALL, "prompt": ids, "max_tokens": OUT,
                                       "ignore_eos": True, "stream": True,
                                       "stream_options": {"include_usage": True}})
    assert res.status == 200 and res.complete and res.data[-1] == "[DONE]", res
    chunks = res.json_chunks()
    content = [t for (t, d), c in zip(res.events, chunks) if c["choices"]]
    gaps = np.diff([t for t, _ in res.events[:len(content)]])
    return content[0] - sent, chunks[-1]["usage"], len(content), float(np.median(gaps))


def _page(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=HTTP_PROBE_S) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def pd_sim(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pd")
    ready, log = tmp / "ready", tmp / "sim.log"
    child = spawn("servelab sim", [sys.executable, "-m", "servelab.commands.sim", "--variant",
                                   "pd_1p1d", *ARGS, "--port", "0", "--ready-file", str(ready),
                                   "--log-stats-interval", "0"], log, ready_file=ready)
    try:
        yield child.wait_ready(SIM_READY_S), log
    finally:
        child.stop()


# Times the transfer to within 6 ms of the model's: a busy neighbour's scheduling delay is larger.
@pytest.mark.serial
def test_pd_streams_from_decode_after_the_transfer_and_each_instance_has_its_page(pd_sim):
    url, log = pd_sim
    rng = np.random.default_rng(5)
    prompts = [rng.integers(300, 8000, PROMPT).tolist() for _ in range(REPEATS)]
    with start_background(hardware="L4", model=SMALL, serve_args=["--max-model-len", "8192"]) \
            as colocated:
        co = [_ttft_and_usage(colocated.url, ids) for ids in prompts]
    pd = [_ttft_and_usage(url, ids) for ids in prompts]   # distinct prompts: no prefix hits
    for ttft, usage, n_content, _ in pd:
        # Every output token reaches the client (the prefill leg's token does not).
        assert n_content == OUT
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT, OUT)
    config, spec, _ = resolve_config("L4", SMALL, variant="pd_1p1d")
    link = kv_link(config, spec.kv_link_gb_s)
    transfer = link.transfer_s(PROMPT)
    # PD adds the hop in, the handoff (prefill answer, hop, KV read), the relay hop, and one
    # decode step for the first token (colocated, it comes out of the prefill step).
    diff = min(t for t, *_ in pd) - min(t for t, *_ in co)
    step = min(g for *_, g in co)
    expected = ROUTER_HOP_S + handoff_s(link, PROMPT) + ROUTER_HOP_S + step
    assert diff > transfer + 2 * ROUTER_HOP_S, (diff, transfer)
    assert abs(diff - expected) < 0.006, (diff, expected, transfer, step)

    # The proxy has no /metrics (the load generator's scrape records "absent"); each instance
    # has its own port, printed in its role's start-up lines.
    with pytest.raises(urllib.error.HTTPError) as err:
        _page(url)
    assert err.value.code == 404
    text = log.read_text()
    urls = dict(re.findall(r"^(prefill-0|decode-0) \| .* at (http://\S+)$", text, re.M))
    roles = {r: "\n".join(line.split(" | ", 1)[1] for line in text.splitlines()
                          if line.startswith(f"{r} | ")) for r in ("prefill-0", "decode-0")}
    for role, lines in roles.items():
        assert "GPU KV cache size:" in lines
        assert read_connector_log(lines).created == ["NixlConnector"], role
    decode = read_connector_metrics(_page(urls["decode-0"]))
    assert decode.transfers == REPEATS and decode.failed_transfers == 0
    assert decode.transfer_bytes == REPEATS * link.transfer_bytes(PROMPT)
    assert decode.transfer_s == pytest.approx(REPEATS * transfer)
    prefill = _page(urls["prefill-0"])
    # The prefill instance generated one token per request; the decode one every streamed one.
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{SMALL}"}} {REPEATS}.0' \
        in prefill
    assert (f'vllm:generation_tokens_total{{engine="0",model_name="{SMALL}"}} '
            f'{REPEATS * OUT}.0') in _page(urls["decode-0"])
    assert read_connector_metrics(prefill).expired_reqs == 0
