"""X-Request-Id as vLLM honours it (serving code's _base_request_id): the response id is
`chatcmpl-<header>` / `cmpl-<header>`, a random id without the header, and /sim/requests records
carry the header, so client rows and server records join on the caller's own id."""
import asyncio
import json
import re

from sim_server_helpers import MODEL, get, sse, sse_post

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Name three rivers."}],
        "max_tokens": 6, "ignore_eos": True, "stream": True}


def _records(url: str, cursor: int) -> list[dict]:
    _, _, raw = get(url, f"/sim/requests?cursor={cursor}")
    return json.loads(raw)["requests"]


def test_response_ids_follow_the_x_request_id_header(sim):
    cursor = 0
    while True:  # page to the newest record, so only this test's requests are read back
        page = json.loads(get(sim.url, f"/sim/requests?cursor={cursor}")[2])
        if not page["requests"]:
            break
        cursor = page["next_cursor"]

    async def two_at_once():  # one id sent twice at once: both streams must still complete
        return await asyncio.gather(*(sse_post(sim.url, "/v1/chat/completions", CHAT,
                                               headers={"X-Request-Id": "run7-w0-42"})
                                      for _ in range(2)))

    for res in asyncio.run(two_at_once()):
        chunks = res.json_chunks()
        assert res.status == 200 and res.complete
        assert {c["id"] for c in chunks} == {"chatcmpl-run7-w0-42"}
        assert sum(len(c["choices"][0]["delta"].get("content", "")) > 0 for c in chunks) == 6
    # any characters survive as valid JSON; completions use vLLM's cmpl- prefix
    plain = sse(sim.url, "/v1/completions", {"model": MODEL, "prompt": "Rivers:", "max_tokens": 3},
                headers={"X-Request-Id": 'odd "id" \\ 1'})
    assert plain.status == 200 and json.loads(plain.body)["id"] == 'cmpl-odd "id" \\ 1'
    bare = sse(sim.url, "/v1/chat/completions", CHAT)
    bare_id = bare.json_chunks()[0]["id"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", bare_id)

    records = _records(sim.url, cursor)
    by_header = [r for r in records if r["x_request_id"] == "run7-w0-42"]
    assert len(by_header) == 2
    assert all(r["request_id"] == "chatcmpl-run7-w0-42" and r["output_tokens"] == 6 for r in by_header)
    (odd,) = [r for r in records if r["kind"] == "completion"]
    assert odd["x_request_id"] == 'odd "id" \\ 1' and odd["request_id"] == 'cmpl-odd "id" \\ 1'
    assert len(records) == 4
    (no_header,) = [r for r in records if r["request_id"] == bare_id]
    assert no_header["x_request_id"] is None
