-- server_metric_names: the one map from a canonical server metric (the name the server views
-- read) to the name each server kind exposes on /metrics; one row per (kind, canonical, exposed).
--   kind      = the server a variant runs ('vllm', 'sglang'; a new kind adds its rows here and
--               the server views read it unchanged).
--   canonical = gauges: running, waiting (requests; summed over engines), kv_usage (KV-cache use
--               0..1, averaged over engines), kv_usage_legacy (the same figure under vLLM's pre-0.9
--               name, read only when kv_usage is absent);
--               counters (ending in _total): preemptions_total, prompt_tokens_total,
--               generation_tokens_total, prefix_cache_queries_total, prefix_cache_hits_total (both
--               in tokens), spec_drafts_total, spec_draft_tokens_total, spec_accepted_tokens_total;
--               the CPU KV-offload tier (vLLM's OffloadingConnector, --kv-offloading-size):
--               offload_queries_total, offload_hits_total (vllm:external_prefix_cache_*, tokens
--               the connector was asked for / found after the GPU prefix cache missed) and
--               offload_bytes_total (vllm:kv_offload_total_bytes, one series per transfer_type:
--               CPU_to_GPU loads, GPU_to_CPU stores; the views tell them apart by that label).
--   exposed   = the metric name as the server writes it; server_series also matches the spelling
--               with the first ':' written '_' (what a Prometheus-style relabelling scraper stores).
-- A sample is matched on its name alone, so the names of different kinds must not collide (each
-- server prefixes its own: vllm:, sglang:, ...). Within a kind one exposed name may stand for two
-- canonical ones: SGLang counts prefix-cache hits as cached prompt tokens, so the queries of its
-- hit rate are its prompt tokens (sglang:cache_hit_rate is the same ratio per batch).
-- SGLang's names are those of its observability/metrics_collector.py, release 0.5.21 (served only
-- with --enable-metrics, which servelab adds): running/waiting = sglang:num_running_reqs /
-- num_queue_reqs (per scheduler: one per DP rank), kv_usage = sglang:token_usage (KV pool tokens in
-- use / pool size), preemptions_total = sglang:num_retracted_requests_total (SGLang retracts where
-- vLLM preempts), prefix_cache_hits_total = sglang:cached_tokens_total (one series per
-- cache_source, device/host; summed). SGLang has no per-draft counters: spec_* stay NULL for it
-- (sglang:spec_accept_length is its gauge).
CREATE OR REPLACE VIEW server_metric_names AS
SELECT * FROM (VALUES
    ('vllm', 'running', 'vllm:num_requests_running'),
    ('vllm', 'waiting', 'vllm:num_requests_waiting'),
    ('vllm', 'kv_usage', 'vllm:kv_cache_usage_perc'),
    ('vllm', 'kv_usage_legacy', 'vllm:gpu_cache_usage_perc'),
    ('vllm', 'preemptions_total', 'vllm:num_preemptions_total'),
    ('vllm', 'prompt_tokens_total', 'vllm:prompt_tokens_total'),
    ('vllm', 'generation_tokens_total', 'vllm:generation_tokens_total'),
    ('vllm', 'prefix_cache_queries_total', 'vllm:prefix_cache_queries_total'),
    ('vllm', 'prefix_cache_hits_total', 'vllm:prefix_cache_hits_total'),
    ('vllm', 'spec_drafts_total', 'vllm:spec_decode_num_drafts_total'),
    ('vllm', 'spec_draft_tokens_total', 'vllm:spec_decode_num_draft_tokens_total'),
    ('vllm', 'spec_accepted_tokens_total', 'vllm:spec_decode_num_accepted_tokens_total'),
    ('vllm', 'offload_queries_total', 'vllm:external_prefix_cache_queries_total'),
    ('vllm', 'offload_hits_total', 'vllm:external_prefix_cache_hits_total'),
    ('vllm', 'offload_bytes_total', 'vllm:kv_offload_total_bytes_total'),
    ('sglang', 'running', 'sglang:num_running_reqs'),
    ('sglang', 'waiting', 'sglang:num_queue_reqs'),
    ('sglang', 'kv_usage', 'sglang:token_usage'),
    ('sglang', 'preemptions_total', 'sglang:num_retracted_requests_total'),
    ('sglang', 'prompt_tokens_total', 'sglang:prompt_tokens_total'),
    ('sglang', 'generation_tokens_total', 'sglang:generation_tokens_total'),
    ('sglang', 'prefix_cache_queries_total', 'sglang:prompt_tokens_total'),
    ('sglang', 'prefix_cache_hits_total', 'sglang:cached_tokens_total')
) AS t(kind, canonical, exposed);
