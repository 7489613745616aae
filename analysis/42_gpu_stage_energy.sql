-- gpu_stage_energy: one row per run x stage with GPU samples (gpu_metrics) in the stage's
-- measured window [measure_start_unix, measure_end_unix), the run's sampled GPUs together.
--   Per GPU, over its samples in the window (at least two, else no power figure):
--     method 'counter' when every sample has the board's energy counter: mean power =
--       (energy_j of the last sample - of the first) / (last - first t_unix);
--     method 'power' otherwise: the time-weighted mean of power_w (trapezoids between samples).
--   power_mean_w = sum of the GPUs' mean power (NULL when one GPU has none); NVML samples every
--     GPU this host shows (CUDA_VISIBLE_DEVICES narrows it), so an idle GPU beside the server's
--     adds its idle power.
--   energy_j = power_mean_w * window_s: the energy the GPUs drew during the window.
--   output_tokens = stage_summary ('(all)' row).output_tokens_per_s * window_s: the output tokens
--     that arrived in the window, the same count throughput uses.
--   joules_per_output_token = energy_j / output_tokens; output_tokens_per_joule = output_tokens /
--     energy_j (NULL without output tokens or without power).
--   util_mean_pct, sm_clock_mean_mhz: means over GPUs and samples; mem_used_max_mib, temp_max_c,
--     power_max_w: the highest sample of any GPU.
CREATE OR REPLACE VIEW gpu_stage_energy AS
WITH
win AS (
    SELECT run_id, stage, level, measure_start_unix AS t0, measure_end_unix AS t1,
           measure_end_unix - measure_start_unix AS window_s
    FROM stages
    WHERE measure_start_unix IS NOT NULL AND measure_end_unix > measure_start_unix
),
samples AS (
    SELECT w.run_id, w.stage, g.source, g.gpu, g.t_unix, g.power_w, g.energy_j, g.util_pct,
           g.sm_clock_mhz, g.mem_used_mib, g.temp_c,
           lag(g.t_unix) OVER p AS prev_t, lag(g.power_w) OVER p AS prev_power
    FROM win w
    JOIN gpu_metrics g ON g.run_id = w.run_id AND g.t_unix >= w.t0 AND g.t_unix < w.t1
    WINDOW p AS (PARTITION BY w.run_id, w.stage, g.source, g.gpu ORDER BY g.t_unix)
),
per_gpu AS (
    SELECT run_id, stage, source, gpu, count(*) AS n,
           max(t_unix) - min(t_unix) AS span_s,
           count(energy_j) = count(*) AS has_counter,
           arg_max(energy_j, t_unix) - arg_min(energy_j, t_unix) AS energy_delta_j,
           sum((power_w + prev_power) / 2 * (t_unix - prev_t)) AS power_area,
           avg(util_pct) AS util, avg(sm_clock_mhz) AS clock, max(mem_used_mib) AS mem,
           max(temp_c) AS temp, max(power_w) AS pmax
    FROM samples
    GROUP BY run_id, stage, source, gpu
),
per_gpu_power AS (
    SELECT *,
           CASE WHEN n < 2 OR span_s <= 0 THEN NULL
                WHEN has_counter AND energy_delta_j >= 0 THEN 'counter'
                ELSE 'power' END AS method
    FROM per_gpu
),
stage_power AS (
    SELECT run_id, stage,
           count(*) AS gpus, sum(n) AS samples, string_agg(DISTINCT source, ',') AS source,
           string_agg(DISTINCT method, ',') AS method,
           CASE WHEN count(method) = count(*) THEN sum(
               CASE method WHEN 'counter' THEN energy_delta_j / span_s
                           ELSE power_area / span_s END) END AS power_mean_w,
           sum(util * n) / sum(n) AS util_mean_pct, sum(clock * n) / sum(n) AS sm_clock_mean_mhz,
           max(mem) AS mem_used_max_mib, max(temp) AS temp_max_c, max(pmax) AS power_max_w
    FROM per_gpu_power
    GROUP BY run_id, stage
)
SELECT
    w.run_id, w.stage, w.level, w.window_s, p.gpus, p.samples, p.source, p.method,
    p.power_mean_w,
    p.power_mean_w * w.window_s AS energy_j,
    ss.output_tokens_per_s * w.window_s AS output_tokens,
    CASE WHEN ss.output_tokens_per_s > 0
         THEN p.power_mean_w * w.window_s / (ss.output_tokens_per_s * w.window_s) END
        AS joules_per_output_token,
    CASE WHEN p.power_mean_w > 0
         THEN ss.output_tokens_per_s * w.window_s / (p.power_mean_w * w.window_s) END
        AS output_tokens_per_joule,
    p.util_mean_pct, p.sm_clock_mean_mhz, p.mem_used_max_mib, p.temp_max_c, p.power_max_w
FROM win w
JOIN stage_power p ON p.run_id = w.run_id AND p.stage = w.stage
LEFT JOIN stage_summary ss
  ON ss.run_id = w.run_id AND ss.stage = w.stage AND ss.class_name = '(all)';
