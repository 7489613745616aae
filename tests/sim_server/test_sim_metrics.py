"""/metrics parsed with prometheus_client's parser: vLLM's names, types, labels, buckets."""
import asyncio

from prometheus_client.parser import text_string_to_metric_families

from servelab.sim.server.metrics import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from sim_server_helpers import MODEL, get, post_json, sse, sse_post

VLLM_TYPES = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter", "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram", "vllm:iteration_tokens_total": "histogram",
    "vllm:cache_config_info": "gauge", "servelab:sim_lag_seconds": "gauge",
    "servelab:sim_step_lag_seconds": "histogram", "servelab:sim_steps": "counter",
}


def scrape(url):
    status, headers, body = get(url, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def value(families, name, sample_name=None, **labels):
    total = 0.0
    for s in families[name].samples:
        if s.name == (sample_name or name) and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def buckets(families, name, engine="0"):
    return [float(s.labels["le"]) for s in families[name].samples
            if s.name == name + "_bucket" and s.labels["engine"] == engine][:-1]


def test_names_types_labels_and_buckets(sim):
    fam = scrape(sim.url)
    for name, kind in VLLM_TYPES.items():
        assert fam[name].type == kind, name
    for name in VLLM_TYPES:
        for s in fam[name].samples:
            if name != "vllm:cache_config_info":
                assert s.labels["model_name"] == MODEL and s.labels["engine"] == "0", s
    assert buckets(fam, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)
    assert buckets(fam, "vllm:inter_token_latency_seconds") == list(ITL_BUCKETS)
    assert buckets(fam, "vllm:e2e_request_latency_seconds") == list(REQUEST_LATENCY_BUCKETS)
    assert buckets(fam, "vllm:request_prompt_tokens")[:6] == [1, 2, 5, 10, 20, 50]
    assert buckets(fam, "vllm:request_prompt_tokens")[-1] == 2000  # 1-2-5 up to max_model_len
    info = fam["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
    assert int(info["num_gpu_blocks"]) > 0
    # The release defines the spec_decode families; without speculative decoding they carry no
    # series (sim/server/metrics_versions.py), which is what verify reads.
    assert not any(fam[n].samples for n in fam if n.startswith("vllm:spec_decode"))
    # counters are exposed with _total (and _created), as prometheus_client and vLLM do
    assert any(s.name == "vllm:prompt_tokens_total" for s in fam["vllm:prompt_tokens"].samples)


def test_counters_advance_with_what_clients_received(sim):
    before = scrape(sim.url)
    prompt = "The same long prefix for the prefix cache. " * 8
    usage = []
    for _ in range(3):
        status, body = post_json(sim.url, "/v1/completions",
                                 {"model": MODEL, "prompt": prompt, "max_tokens": 5,
                                  "ignore_eos": True})
        usage.append(body["usage"])
    after = scrape(sim.url)

    def delta(name, sample=None, **labels):
        return value(after, name, sample, **labels) - value(before, name, sample, **labels)

    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == sum(
        u["prompt_tokens"] for u in usage)
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == 15
    assert delta("vllm:request_success", "vllm:request_success_total",
                 finished_reason="length") == 3
    assert delta("vllm:time_to_first_token_seconds",
                 "vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds",
                 "vllm:inter_token_latency_seconds_count") == 12  # 4 gaps per request
    assert delta("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") > 0
    assert delta("servelab:sim_steps", "servelab:sim_steps_total") >= 5
    assert delta("servelab:sim_step_lag_seconds", "servelab:sim_step_lag_seconds_count") >= 5


def test_dp2_shows_two_engines_and_spec_decode_counters(spec_sim):
    async def burst():
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 30, "ignore_eos": True,
                "stream": True}
        return await asyncio.gather(*(sse_post(spec_sim.url, "/v1/completions", body)
                                      for _ in range(8)))

    results = asyncio.run(burst())
    assert all(r.data[-1] == "[DONE]" for r in results)
    fam = scrape(spec_sim.url)
    per_engine = {e: value(fam, "vllm:request_success", "vllm:request_success_total", engine=e)
                  for e in ("0", "1")}
    assert per_engine["0"] >= 3 and per_engine["1"] >= 3  # least-outstanding balancing
    assert {s.labels["engine"] for s in fam["vllm:num_requests_running"].samples} == {"0", "1"}
    drafts = value(fam, "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_drafts_total")
    draft_tokens = value(fam, "vllm:spec_decode_num_draft_tokens",
                         "vllm:spec_decode_num_draft_tokens_total")
    accepted = value(fam, "vllm:spec_decode_num_accepted_tokens",
                     "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and draft_tokens == 4 * drafts and 0 < accepted <= draft_tokens
    positions = {s.labels["position"] for s in fam["vllm:spec_decode_num_accepted_tokens_per_pos"]
                 .samples if s.name.endswith("_total")}
    assert positions == {"0", "1", "2", "3"}
    assert value(fam, "vllm:spec_decode_num_accepted_tokens_per_pos",
                 "vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted


def test_mean_acceptance_length_follows_the_prompts_content(spec_sim):
    """n-gram drafts on random token soup are mostly rejected; on English prose they are
    accepted as often as the defaults say (vLLM's mean acceptance length = 1 + accepted/drafts)."""
    import random

    from servelab.core.paths import DATA_DIR

    prose = (DATA_DIR / "modern_prose.txt").read_text().split()
    rng = random.Random(11)

    def english(i):
        return " ".join(prose[300 * i:300 * i + 250])

    def soup(i):
        return [rng.randrange(1000, 16000) for _ in range(300)]

    def mean_acceptance_length(make_prompt):
        names = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")
        before = scrape(spec_sim.url)
        drafts0, accepted0 = (value(before, n, n + "_total") for n in names)

        async def burst():
            return await asyncio.gather(*(sse_post(spec_sim.url, "/v1/completions", {
                "model": MODEL, "prompt": make_prompt(i), "max_tokens": 48, "ignore_eos": True,
                "temperature": 0, "stream": True}) for i in range(8)))

        assert all(r.data[-1] == "[DONE]" for r in asyncio.run(burst()))
        after = scrape(spec_sim.url)
        drafts, accepted = (value(after, n, n + "_total") for n in names)
        assert drafts - drafts0 > 30
        return 1 + (accepted - accepted0) / (drafts - drafts0)

    real, noise = mean_acceptance_length(english), mean_acceptance_length(soup)
    assert real > 2.2 and noise < 1.5, (real, noise)


def test_http_requests_total_counts_routes_methods_and_status_classes(sim):
    def count(status, handler="/v1/completions"):
        return value(scrape(sim.url), "http_requests", "http_requests_total", handler=handler,
                     method="POST", status=status)

    ok0, bad0 = count("2xx"), count("4xx")
    assert post_json(sim.url, "/v1/completions", {"model": MODEL, "prompt": "hi",
                                                  "max_tokens": 2})[0] == 200
    assert sse(sim.url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                            "stream": True}).status == 200
    assert post_json(sim.url, "/v1/completions", {"model": "nope", "prompt": "hi"})[0] == 404
    assert (count("2xx"), count("4xx")) == (ok0 + 2, bad0 + 1)
    fam = scrape(sim.url)
    assert fam["http_requests"].type == "counter"
    assert not {s.labels["handler"] for s in fam["http_requests"].samples} & {"/metrics", "/health"}
