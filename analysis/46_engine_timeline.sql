-- engine_timeline: one row per run x wall-clock second (t_unix = the second) with what the
-- server's engine and GPUs did, to lay beside client_timeline and server_timeline:
--   steps, context_tokens, generation_tokens  server_iterations whose logged second
--                                             (log_second_unix) it is, all engines summed: the
--                                             engine's steps and scheduled tokens per second;
--   kv_cache_usage_pct_max, elapsed_ms_mean   the highest KV use and the mean step wait logged;
--   power_w, util_pct                         gpu_metrics samples in the second: power averaged
--                                             per GPU then summed over GPUs; utilisation averaged.
-- A second with neither is absent. t_rel_s = t_unix - runs.started_unix.
CREATE OR REPLACE VIEW engine_timeline AS
WITH
steps AS (
    SELECT run_id, log_second_unix AS t_unix, count(*) AS steps,
           sum(context_tokens) AS context_tokens, sum(generation_tokens) AS generation_tokens,
           max(kv_cache_usage_pct) AS kv_cache_usage_pct_max, avg(elapsed_ms) AS elapsed_ms_mean
    FROM server_iterations
    GROUP BY run_id, log_second_unix
),
per_gpu AS (
    SELECT run_id, floor(t_unix) AS t_unix, source, gpu, avg(power_w) AS power_w,
           avg(util_pct) AS util_pct
    FROM gpu_metrics
    GROUP BY run_id, floor(t_unix), source, gpu
),
gpus AS (
    SELECT run_id, t_unix, sum(power_w) AS power_w, avg(util_pct) AS util_pct
    FROM per_gpu
    GROUP BY run_id, t_unix
)
SELECT run_id, t_unix, t_unix - r.started_unix AS t_rel_s,
       coalesce(steps, 0) AS steps, coalesce(context_tokens, 0) AS context_tokens,
       coalesce(generation_tokens, 0) AS generation_tokens, kv_cache_usage_pct_max,
       elapsed_ms_mean, power_w, util_pct
FROM steps FULL OUTER JOIN gpus USING (run_id, t_unix)
JOIN runs r USING (run_id);
