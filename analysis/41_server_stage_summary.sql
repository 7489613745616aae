-- server_stage_summary: one row per run x stage with scraped server metrics in the stage's
-- measured window [measure_start_unix, measure_end_unix).
--   Gauges, from server_timeline rows whose sample_unix lies in the window: running_mean/max,
--     waiting_mean/max (summed over engines per sample), kv_cache_usage_mean (mean over samples of
--     the engine mean) and kv_cache_usage_max (highest engine, any sample).
--   Counters, from server_series samples in the window: per series, increase = sum of the
--     reset-aware deltas of every sample after the series' first sample in the window, i.e. the
--     counter's growth between the first and the last scrape inside the window; summed over
--     series. span_s = last - first scrape time in the window (max over series).
--     preemptions = increase(num_preemptions_total); preemptions_per_s = preemptions / span_s;
--     generation_tokens_per_s = increase(generation_tokens_total) / span_s (the server's own
--     count, a cross-check of stage_summary.output_tokens_per_s);
--     prefix_cache_hit_rate = increase(hits) / increase(queries);
--     spec_acceptance_rate = increase(accepted tokens) / increase(draft tokens);
--     spec_mean_acceptance_length = 1 + increase(accepted tokens) / increase(drafts).
--     CPU KV offload (NULL without a tier): offload_queries, offload_hits, offload_hit_rate,
--     prefix_hit_rate_any_tier as in server_timeline but over the window's increases;
--     offload_load_bytes / offload_store_bytes = increase(offload_bytes_total) of the
--     transfer_type CPU_to_GPU / GPU_to_CPU series, and each / span_s.
--   A stage with fewer than two scrapes in its window has no counter figures (NULL).
CREATE OR REPLACE VIEW server_stage_summary AS
WITH
gauges AS (
    SELECT
        s.run_id, s.stage,
        count(*) AS samples,
        avg(t.running) AS running_mean,
        max(t.running) AS running_max,
        avg(t.waiting) AS waiting_mean,
        max(t.waiting) AS waiting_max,
        avg(t.kv_cache_usage) AS kv_cache_usage_mean,
        max(t.kv_cache_usage_max) AS kv_cache_usage_max
    FROM stages s
    JOIN server_timeline t
      ON t.run_id = s.run_id
     AND t.sample_unix >= s.measure_start_unix
     AND t.sample_unix < s.measure_end_unix
    GROUP BY s.run_id, s.stage
),
in_window AS (
    SELECT
        s.run_id, s.stage, x.name, x.metric, x.series, x.t_unix, x.delta,
        row_number() OVER (PARTITION BY s.run_id, s.stage, x.name, x.metric, x.series
                           ORDER BY x.t_unix) AS nth
    FROM stages s
    JOIN server_series x
      ON x.run_id = s.run_id
     AND x.t_unix >= s.measure_start_unix
     AND x.t_unix < s.measure_end_unix
    WHERE x.metric LIKE '%\_total' ESCAPE '\'
),
per_series AS (
    SELECT run_id, stage, name, metric, series,
           sum(delta) FILTER (WHERE nth > 1) AS increase,
           max(t_unix) - min(t_unix) AS span_s,
           count(*) AS samples
    FROM in_window
    GROUP BY run_id, stage, name, metric, series
),
counters AS (
    SELECT
        run_id, stage,
        max(span_s) AS span_s,
        UNNEST(servelab_counter_sums(increase, metric, series))
    FROM per_series
    WHERE samples >= 2
    GROUP BY run_id, stage
)
SELECT
    s.run_id,
    s.stage,
    s.kind,
    s.level,
    s.measure_end_unix - s.measure_start_unix AS window_s,
    coalesce(g.samples, 0) AS samples,
    g.running_mean,
    g.running_max,
    g.waiting_mean,
    g.waiting_max,
    g.kv_cache_usage_mean,
    g.kv_cache_usage_max,
    c.span_s,
    c.preemptions,
    c.preemptions / nullif(c.span_s, 0) AS preemptions_per_s,
    c.generation_tokens / nullif(c.span_s, 0) AS generation_tokens_per_s,
    UNNEST(servelab_cache_figures(c.prefix_cache_queries, c.prefix_cache_hits, c.spec_drafts,
                                  c.spec_draft_tokens, c.spec_accepted_tokens,
                                  c.offload_queries, c.offload_hits)),
    c.offload_load_bytes,
    c.offload_load_bytes / nullif(c.span_s, 0) AS offload_load_bytes_per_s,
    c.offload_store_bytes,
    c.offload_store_bytes / nullif(c.span_s, 0) AS offload_store_bytes_per_s
FROM stages s
LEFT JOIN gauges g ON g.run_id = s.run_id AND g.stage = s.stage
LEFT JOIN counters c ON c.run_id = s.run_id AND c.stage = s.stage;
