-- server_timeline: one row per run x wall-clock second (t_unix = floor(sample time)) in which the
-- target's /metrics was scraped, from server_series (canonical names of server_metric_names, e.g.
-- running = vllm:num_requests_running; one series per engine).
--   Gauges, summed over series (one per engine): running, waiting.
--   kv_cache_usage = MEAN over engines of kv_usage (0..1; kv_usage_legacy, vLLM's pre-0.9 name,
--     when kv_usage is absent); kv_cache_usage_max = max engine.
--   Counters (…_total): server_series.delta (reset-aware); per-second rates = sum over series of
--     delta / dt_s (dt_s = time since that series' previous sample).
--   preemptions = sum delta(preemptions_total); preemptions_per_s = sum(delta/dt_s).
--   prompt_tokens_per_s, generation_tokens_per_s from prompt_tokens_total and
--     generation_tokens_total.
--   prefix_cache_hit_rate = sum delta(prefix_cache_hits_total) / sum delta(prefix_cache_queries_total)
--     (both count tokens).
--   spec_acceptance_rate = delta(spec_accepted_tokens_total)
--                          / delta(spec_draft_tokens_total);
--   spec_mean_acceptance_length = 1 + delta(accepted tokens) / delta(spec_drafts_total)
--     (the 1 is the bonus token every verification step yields), as vLLM's own log line.
--   CPU KV offload (NULL without a tier): offload_queries, offload_hits = sum delta of
--     offload_queries_total / offload_hits_total (tokens); offload_hit_rate = hits / queries
--     (of the tokens asked for, the share the CPU tier served); prefix_hit_rate_any_tier =
--     (prefix_cache_hits + offload_hits) / prefix_cache_queries (vLLM counts both queries over
--     every prompt token, so this is the share of prompt tokens not recomputed);
--     offload_load_bytes / offload_store_bytes = sum delta of offload_bytes_total in the series
--     labelled transfer_type CPU_to_GPU / GPU_to_CPU, and their per-second rates.
--   sample_unix = the last sample time in the second. stage = the latest stage started at or
--   before sample_unix, NULL once that stage has ended; measured = sample_unix lies in that
--   stage's [measure_start_unix, measure_end_unix). t_rel_s = t_unix - runs.started_unix.
CREATE OR REPLACE VIEW server_timeline AS
WITH per_second AS (
    SELECT
        run_id,
        second AS t_unix,
        max(t_unix) AS sample_unix,
        sum(value) FILTER (WHERE metric = 'running') AS running,
        sum(value) FILTER (WHERE metric = 'waiting') AS waiting,
        count(*) FILTER (WHERE metric = 'running') AS engines,
        coalesce(avg(value) FILTER (WHERE metric = 'kv_usage'),
                 avg(value) FILTER (WHERE metric = 'kv_usage_legacy')) AS kv_cache_usage,
        coalesce(max(value) FILTER (WHERE metric = 'kv_usage'),
                 max(value) FILTER (WHERE metric = 'kv_usage_legacy')) AS kv_cache_usage_max,
        servelab_counter_sums(delta, metric, series) AS deltas,
        -- the rates this view reports (each the counter of its figure in servelab_counter_sums)
        sum(delta / dt_s) FILTER (WHERE metric = 'preemptions_total') AS preemptions_per_s,
        sum(delta / dt_s) FILTER (WHERE metric = 'prompt_tokens_total') AS prompt_tokens_per_s,
        sum(delta / dt_s) FILTER (WHERE metric = 'generation_tokens_total') AS generation_tokens_per_s,
        sum(delta / dt_s) FILTER (WHERE metric = 'offload_bytes_total'
                           AND contains(lower(series), 'transfer_type=cpu_to_gpu')) AS offload_load_bytes_per_s,
        sum(delta / dt_s) FILTER (WHERE metric = 'offload_bytes_total'
                           AND contains(lower(series), 'transfer_type=gpu_to_cpu')) AS offload_store_bytes_per_s
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
    p.deltas.preemptions,
    p.preemptions_per_s,
    p.prompt_tokens_per_s,
    p.deltas.generation_tokens,
    p.generation_tokens_per_s,
    UNNEST(servelab_cache_figures(p.deltas.prefix_cache_queries, p.deltas.prefix_cache_hits,
                                  p.deltas.spec_drafts, p.deltas.spec_draft_tokens,
                                  p.deltas.spec_accepted_tokens, p.deltas.offload_queries,
                                  p.deltas.offload_hits)),
    p.deltas.offload_load_bytes,
    p.offload_load_bytes_per_s,
    p.deltas.offload_store_bytes,
    p.offload_store_bytes_per_s
FROM per_second p
LEFT JOIN runs ru ON ru.run_id = p.run_id
ASOF LEFT JOIN stages s
       ON s.run_id = p.run_id
      AND p.sample_unix >= s.started_unix;
