"""--faults: the grammar, and each kind observed on the wire at its configured rate."""
import asyncio
import json
from collections import Counter

import pytest

from servelab.core.errors import ServelabError
from servelab.sim.server.faults import parse_faults
from servelab.sim.server.server import start_background
from sim_server_helpers import FAST, MODEL, get, sse_post

STALL_S = 0.25
SPEC = (f"http429=0.1,http500=0.05,http503=0.05,stall=0.1:{int(STALL_S * 1000)}ms,cut=0.1,"
        "malformed=0.1,error_event=0.1")
N = 200


def test_grammar():
    spec = parse_faults("http429=0.05, stall=0.02:2.5s,cut=0.03,error_event=0")
    assert spec.rates == {"http429": 0.05, "stall": 0.02, "cut": 0.03, "error_event": 0.0}
    assert spec.stall_s == 2.5
    assert parse_faults("stall=0.5:250ms").stall_s == 0.25
    assert not parse_faults(None).enabled
    for bad, words in [("bogus=0.1", "unknown kind 'bogus'"), ("http429", "KIND=RATE"),
                       ("stall=0.1", "pause length"), ("cut=0.1:2s", "only 'stall'"),
                       ("cut=1.5", "outside 0 to 1"), ("cut=x", "not a number"),
                       ("cut=0.6,http500=0.6", "add up to 1.2"), ("cut=0.1,cut=0.2", "twice")]:
        with pytest.raises(ServelabError, match="--faults") as e:
            parse_faults(bad)
        assert words in str(e.value), (bad, str(e.value))


def classify(res):
    if res.status != 200:
        return f"http{res.status}"
    kinds = []
    if not res.complete:
        kinds.append("cut")
    parsed = []
    for t, d in res.events:
        if d == "[DONE]":
            continue
        try:
            parsed.append((t, json.loads(d)))
        except json.JSONDecodeError:
            kinds.append("malformed")
    if any("error" in c for _, c in parsed):
        kinds.append("error_event")
    assert len(kinds) <= 1, kinds
    return kinds[0] if kinds else "ok"  # "ok" includes stalls: a busy machine also makes gaps


def test_each_fault_kind_on_the_wire():
    body = {"model": MODEL, "prompt": "fault test", "max_tokens": 12, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}

    async def run(url):
        sem = asyncio.Semaphore(50)

        async def one():
            async with sem:
                return await sse_post(url, "/v1/completions", body)
        return await asyncio.gather(*(one() for _ in range(N)))

    with start_background(seed=42, faults=SPEC, **FAST) as bg:
        results = asyncio.run(run(bg.url))
        status, _, raw = get(bg.url, f"/sim/requests?limit={N + 10}")
    records = {r["request_id"]: r for r in json.loads(raw)["requests"]}
    kinds = Counter()
    for r in results:
        kind = classify(r)
        record = records[r.json_chunks()[0]["id"]] if kind == "ok" else None
        if record is not None and record["fault"] == "stall":
            # The pause is judged on the server's own write times: a client on a busy machine can
            # read the chunk before the pause late, which shortens the gap it sees.
            times = record["chunk_times"]
            assert max(b - a for a, b in zip(times, times[1:])) >= STALL_S * 0.95
            kind = "stall"
        kinds[kind] += 1
    rates = dict(kv.split("=") for kv in SPEC.split(","))
    for kind, rate in rates.items():
        expected = N * float(rate.split(":")[0])
        sd = (expected * (1 - expected / N)) ** 0.5
        assert abs(kinds[kind] - expected) <= 3.5 * sd, (kind, kinds)
    assert kinds["ok"] > 0, kinds
    # the server's own accounting names the same faults
    recorded = Counter(r["fault"] or "ok" for r in records.values())
    assert recorded == kinds

    for r in results:
        kind = classify(r)
        if kind in ("http429", "http503"):
            assert r.headers["retry-after"] == "1"
            err = json.loads(r.body)["error"]
            assert err["code"] == r.status and err["message"]
        elif kind == "cut":
            assert "[DONE]" not in r.data and len(r.json_chunks()) >= 1
        elif kind == "error_event":
            chunks = r.json_chunks()
            assert r.complete and r.data[-1] == "[DONE]"
            assert set(chunks[-1]["error"]) == {"message", "type", "param", "code"}
            assert all("error" not in c for c in chunks[:-1]) and len(chunks) >= 2
        elif kind in ("malformed", "ok"):
            good = [json.loads(d) for d in r.data if d != "[DONE]" and d.startswith('{"id"')
                    and d.endswith("}")]
            assert r.complete and r.data[-1] == "[DONE]"
            assert good[-1]["usage"]["completion_tokens"] == 12
            assert "".join(c["choices"][0]["text"] for c in good if c["choices"])


def test_a_crashed_engine_fails_its_streams_and_health_as_vllm_does(capfd):
    with start_background(seed=1, **FAST) as bg:
        engine = bg.server.engines[0]
        real_step = engine.step
        calls = []

        def failing_step(now):
            calls.append(now)
            if len(calls) > 3:
                raise RuntimeError("simulated engine bug")
            return real_step(now)

        engine.step = failing_step  # the engine breaks mid-request
        res = asyncio.run(sse_post(bg.url, "/v1/completions", {
            "model": MODEL, "prompt": "x", "max_tokens": 50, "ignore_eos": True, "stream": True}))
        assert res.status == 200 and res.data[-1] == "[DONE]"
        assert res.json_chunks()[-1]["error"]["message"].startswith("EngineCore encountered")
        assert get(bg.url, "/health")[0] == 503
        after = asyncio.run(sse_post(bg.url, "/v1/completions", {"model": MODEL, "prompt": "x"}))
        assert after.status == 500 and json.loads(after.body)["error"]["code"] == 500
    assert "simulated engine bug" in capfd.readouterr().err
