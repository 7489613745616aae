-- server_series: the scraped server metrics that the server views use (server_metric_names), one
-- row per run x metric x series x wall-clock second (second = floor(t_unix)); a series is (name,
-- labels), read once per canonical metric it stands for.
--   name   = the exposed name (server_metric_names.exposed; 'vllm_x' as scraped reads 'vllm:x');
--   metric = its canonical name (server_metric_names.canonical), what the server views filter on.
-- Within a second a series keeps its last sample (t_unix, value).
--   delta = value - the previous kept value of the series; a negative difference is a counter
--           reset (a restarted server) and counts as the new value; NULL for the first sample.
--   dt_s  = t_unix - the previous kept t_unix of the series.
-- delta and dt_s only mean something for counters (canonical names ending in _total).
-- The ratios server_timeline (per second) and server_stage_summary (per window) both derive from
-- counter increases, defined once here:
--   servelab_share(part, whole)                  = part / whole, NULL when whole is 0 or NULL
--                                                  (prefix-cache hit rate, draft acceptance rate);
--   servelab_acceptance_length(accepted, drafts) = 1 + accepted / drafts (the 1 is the bonus token
--                                                  every verification step yields, as vLLM's log);
--   servelab_cache_figures(prefix queries, prefix hits, drafts, draft tokens, accepted tokens,
--     offload queries, offload hits): those increases and the ratios both views report from them
--     (prefix_cache_hit_rate, spec_acceptance_rate, spec_mean_acceptance_length, offload_hit_rate,
--     prefix_hit_rate_any_tier), one struct in the views' column order; UNNEST spreads it;
--   servelab_counter_sums(x, metric, series): per counter figure, the sum of x (a delta, a rate,
--     an increase) over the rows of the counter it is read from, as one struct: preemptions
--     (preemptions_total), prompt_tokens, generation_tokens, prefix_cache_queries,
--     prefix_cache_hits, spec_drafts, spec_draft_tokens, spec_accepted_tokens, offload_queries,
--     offload_hits (each <figure>_total) and offload_load_bytes / offload_store_bytes
--     (offload_bytes_total, the series labelled transfer_type CPU_to_GPU / GPU_to_CPU).
CREATE OR REPLACE MACRO servelab_share(part, whole) AS part / nullif(whole, 0);
CREATE OR REPLACE MACRO servelab_acceptance_length(accepted, drafts) AS 1 + accepted / nullif(drafts, 0);
CREATE OR REPLACE MACRO servelab_cache_figures(prefix_queries, prefix_hits, drafts, draft_tokens,
                                               accepted_tokens, offload_queries, offload_hits) AS {
    'prefix_cache_queries': prefix_queries,
    'prefix_cache_hits': prefix_hits,
    'prefix_cache_hit_rate': servelab_share(prefix_hits, prefix_queries),
    'spec_drafts': drafts,
    'spec_draft_tokens': draft_tokens,
    'spec_accepted_tokens': accepted_tokens,
    'spec_acceptance_rate': servelab_share(accepted_tokens, draft_tokens),
    'spec_mean_acceptance_length': servelab_acceptance_length(accepted_tokens, drafts),
    'offload_queries': offload_queries,
    'offload_hits': offload_hits,
    'offload_hit_rate': servelab_share(offload_hits, offload_queries),
    'prefix_hit_rate_any_tier': servelab_share(prefix_hits + offload_hits, prefix_queries)};
CREATE OR REPLACE MACRO servelab_counter_sums(x, metric, series) AS {
    'preemptions': sum(x) FILTER (WHERE metric = 'preemptions_total'),
    'prompt_tokens': sum(x) FILTER (WHERE metric = 'prompt_tokens_total'),
    'generation_tokens': sum(x) FILTER (WHERE metric = 'generation_tokens_total'),
    'prefix_cache_queries': sum(x) FILTER (WHERE metric = 'prefix_cache_queries_total'),
    'prefix_cache_hits': sum(x) FILTER (WHERE metric = 'prefix_cache_hits_total'),
    'spec_drafts': sum(x) FILTER (WHERE metric = 'spec_drafts_total'),
    'spec_draft_tokens': sum(x) FILTER (WHERE metric = 'spec_draft_tokens_total'),
    'spec_accepted_tokens': sum(x) FILTER (WHERE metric = 'spec_accepted_tokens_total'),
    'offload_queries': sum(x) FILTER (WHERE metric = 'offload_queries_total'),
    'offload_hits': sum(x) FILTER (WHERE metric = 'offload_hits_total'),
    'offload_load_bytes': sum(x) FILTER (WHERE metric = 'offload_bytes_total'
                                         AND contains(lower(series), 'transfer_type=cpu_to_gpu')),
    'offload_store_bytes': sum(x) FILTER (WHERE metric = 'offload_bytes_total'
                                          AND contains(lower(series), 'transfer_type=gpu_to_cpu'))};

CREATE OR REPLACE VIEW server_series AS
WITH
names AS (
    SELECT canonical, exposed, exposed AS scraped FROM server_metric_names
    UNION ALL
    SELECT canonical, exposed, regexp_replace(exposed, ':', '_') FROM server_metric_names
    WHERE contains(exposed, ':')
),
samples AS (
    SELECT
        m.run_id,
        n.exposed AS name,
        n.canonical AS metric,
        CAST(m.labels AS VARCHAR) AS series,
        floor(m.t_unix) AS second,
        m.t_unix,
        m.value
    FROM server_metrics m
    JOIN names n ON n.scraped = m.name
),
kept AS (
    SELECT run_id, name, metric, series, second, max(t_unix) AS t_unix, arg_max(value, t_unix) AS value
    FROM samples
    GROUP BY run_id, name, metric, series, second
)
SELECT
    run_id, name, series, second, t_unix, value,
    CASE WHEN value - lag(value) OVER w < 0 THEN value
         ELSE value - lag(value) OVER w END AS delta,
    t_unix - lag(t_unix) OVER w AS dt_s,
    metric
FROM kept
WINDOW w AS (PARTITION BY run_id, name, metric, series ORDER BY second);
