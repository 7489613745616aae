-- server_series: the scraped vLLM metrics that the server views use, one row per run x series x
-- wall-clock second (second = floor(t_unix)); a series is (name, labels), names with 'vllm_' read
-- as 'vllm:'. Within a second a series keeps its last sample (t_unix, value).
--   delta = value - the previous kept value of the series; a negative difference is a counter
--           reset (a restarted server) and counts as the new value; NULL for the first sample.
--   dt_s  = t_unix - the previous kept t_unix of the series.
-- delta and dt_s only mean something for counters (names ending in _total).
CREATE OR REPLACE VIEW server_series AS
WITH samples AS (
    SELECT
        run_id,
        regexp_replace(name, '^vllm_', 'vllm:') AS name,
        CAST(labels AS VARCHAR) AS series,
        floor(t_unix) AS second,
        t_unix,
        value
    FROM server_metrics
    WHERE regexp_replace(name, '^vllm_', 'vllm:') IN (
        'vllm:num_requests_running', 'vllm:num_requests_waiting',
        'vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc',
        'vllm:num_preemptions_total', 'vllm:prompt_tokens_total', 'vllm:generation_tokens_total',
        'vllm:prefix_cache_queries_total', 'vllm:prefix_cache_hits_total',
        'vllm:spec_decode_num_drafts_total', 'vllm:spec_decode_num_draft_tokens_total',
        'vllm:spec_decode_num_accepted_tokens_total')
),
kept AS (
    SELECT run_id, name, series, second, max(t_unix) AS t_unix, arg_max(value, t_unix) AS value
    FROM samples
    GROUP BY run_id, name, series, second
)
SELECT
    run_id, name, series, second, t_unix, value,
    CASE WHEN value - lag(value) OVER w < 0 THEN value
         ELSE value - lag(value) OVER w END AS delta,
    t_unix - lag(t_unix) OVER w AS dt_s
FROM kept
WINDOW w AS (PARTITION BY run_id, name, series ORDER BY second);
