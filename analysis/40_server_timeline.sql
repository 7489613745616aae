-- server_timeline: one row per run x wall-clock second (t_unix = floor(sample time)) in which the
-- target's /metrics was scraped, from server_series (vLLM V1 names; one series per engine).
--   Gauges, summed over series (one per engine): running = vllm:num_requests_running,
--     waiting = vllm:num_requests_waiting.
--   kv_cache_usage = MEAN over engines of vllm:kv_cache_usage_perc (0..1; the pre-0.9 name
--     vllm:gpu_cache_usage_perc when the new one is absent); kv_cache_usage_max = max engine.
--   Counters (…_total): server_series.delta (reset-aware); per-second rates = sum over series of
--     delta / dt_s (dt_s = time since that series' previous sample).
--   preemptions = sum delta(vllm:num_preemptions_total); preemptions_per_s = sum(delta/dt_s).
--   prompt_tokens_per_s, generation_tokens_per_s from vllm:prompt_tokens_total and
--     vllm:generation_tokens_total.
--   prefix_cache_hit_rate = sum delta(prefix_cache_hits_total) / sum delta(prefix_cache_queries_total)
--     (both count tokens).
--   spec_acceptance_rate = delta(spec_decode_num_accepted_tokens_total)
--                          / delta(spec_decode_num_draft_tokens_total);
--   spec_mean_acceptance_length = 1 + delta(accepted tokens) / delta(spec_decode_num_drafts_total)
--     (the 1 is the bonus token every verification step yields), as vLLM's own log line.
--   sample_unix = the last sample time in the second. stage = the latest stage started at or
--   before sample_unix, NULL once that stage has ended; measured = sample_unix lies in that
--   stage's [measure_start_unix, measure_end_unix). t_rel_s = t_unix - runs.started_unix.
CREATE OR REPLACE VIEW server_timeline AS
WITH per_second AS (
    SELECT
        run_id,
        second AS t_unix,
        max(t_unix) AS sample_unix,
        sum(value) FILTER (WHERE name = 'vllm:num_requests_running') AS running,
        sum(value) FILTER (WHERE name = 'vllm:num_requests_waiting') AS waiting,
        count(*) FILTER (WHERE name = 'vllm:num_requests_running') AS engines,
        coalesce(avg(value) FILTER (WHERE name = 'vllm:kv_cache_usage_perc'),
                 avg(value) FILTER (WHERE name = 'vllm:gpu_cache_usage_perc')) AS kv_cache_usage,
        coalesce(max(value) FILTER (WHERE name = 'vllm:kv_cache_usage_perc'),
                 max(value) FILTER (WHERE name = 'vllm:gpu_cache_usage_perc')) AS kv_cache_usage_max,
        sum(delta) FILTER (WHERE name = 'vllm:num_preemptions_total') AS preemptions,
        sum(delta / dt_s) FILTER (WHERE name = 'vllm:num_preemptions_total') AS preemptions_per_s,
        sum(delta / dt_s) FILTER (WHERE name = 'vllm:prompt_tokens_total') AS prompt_tokens_per_s,
        sum(delta) FILTER (WHERE name = 'vllm:generation_tokens_total') AS generation_tokens,
        sum(delta / dt_s) FILTER (WHERE name = 'vllm:generation_tokens_total') AS generation_tokens_per_s,
        sum(delta) FILTER (WHERE name = 'vllm:prefix_cache_queries_total') AS prefix_cache_queries,
        sum(delta) FILTER (WHERE name = 'vllm:prefix_cache_hits_total') AS prefix_cache_hits,
        sum(delta) FILTER (WHERE name = 'vllm:spec_decode_num_drafts_total') AS spec_drafts,
        sum(delta) FILTER (WHERE name = 'vllm:spec_decode_num_draft_tokens_total') AS spec_draft_tokens,
        sum(delta) FILTER (WHERE name = 'vllm:spec_decode_num_accepted_tokens_total') AS spec_accepted_tokens
    FROM server_series
    GROUP BY run_id, second
)
SELECT
    p.run_id,
    p.t_unix,
    p.t_unix - ru.started_unix AS t_rel_s,
    p.sample_unix,
    CASE WHEN p.sample_unix < coalesce(s.ended_unix, 'infinity'::DOUBLE) THEN s.stage END AS stage,
    coalesce(p.sample_unix >= s.measure_start_unix AND p.sample_unix < s.measure_end_unix, false)
        AS measured,
    p.engines,
    p.running,
    p.waiting,
    p.kv_cache_usage,
    p.kv_cache_usage_max,
    p.preemptions,
    p.preemptions_per_s,
    p.prompt_tokens_per_s,
    p.generation_tokens,
    p.generation_tokens_per_s,
    p.prefix_cache_queries,
    p.prefix_cache_hits,
    p.prefix_cache_hits / nullif(p.prefix_cache_queries, 0) AS prefix_cache_hit_rate,
    p.spec_drafts,
    p.spec_draft_tokens,
    p.spec_accepted_tokens,
    p.spec_accepted_tokens / nullif(p.spec_draft_tokens, 0) AS spec_acceptance_rate,
    1 + p.spec_accepted_tokens / nullif(p.spec_drafts, 0) AS spec_mean_acceptance_length
FROM per_second p
LEFT JOIN runs ru ON ru.run_id = p.run_id
ASOF LEFT JOIN stages s
       ON s.run_id = p.run_id
      AND p.sample_unix >= s.started_unix;
