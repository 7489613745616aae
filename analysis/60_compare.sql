-- compare: the same stage (same stage index and class) of runs of the same profile side by
-- side, one row per run x stage x class x metric, against a baseline run.
--   baseline_run = per profile_name, the run tagged baseline=true (runs.tags), else the
--     earliest started run. (servelab compare picks any runs and any baseline; this view is the
--     fixed-rule version for SQL users.)
--   ratio = value / baseline_value (1 when both are equal, including both infinite).
--   better = 'lower' for latencies and error_rate, 'higher' for throughput, goodput, attainment;
--   improved = value is strictly better than the baseline's.
--   Run-to-run noise: runs with the same profile_name, variant, hardware and model are repeats.
--     noise_band = max - min of the metric over the repeats of the run's configuration and of
--     the baseline's (the larger of the two); within_noise = |value - baseline_value| <= noise_band,
--     NULL when neither configuration was repeated. (servelab compare adds bootstrap confidence
--     intervals computed over the raw requests.)
--   flags, baseline_flags = run_overview.flags of the run and of the baseline run (e.g.
--     unverified, variant_mismatch, generator_saturated): a row whose flags are not empty
--     compares a figure that must not be read as a clean measurement of its variant.
-- Metrics: ttft_p50_ms, ttft_p99_ms, ttft_p99_adj_ms, itl_p50_ms, itl_p99_ms (per-token view),
--   tpot_p50_ms, tpot_p99_ms, e2e_p50_ms, e2e_p99_ms, error_rate (lower is better);
--   output_tokens_per_s, output_tokens_per_s_per_gpu, requests_per_s, goodput, slo_attainment
--   (higher is better), all from stage_summary.
CREATE OR REPLACE VIEW compare AS
WITH
run_keys AS (
    SELECT
        run_id, profile_name, variant, hardware, model, started_unix,
        first_value(run_id) OVER (
            PARTITION BY profile_name
            ORDER BY coalesce(tags['baseline'] = 'true', false) DESC, started_unix, run_id
        ) AS baseline_run
    FROM runs
),
run_flags AS (
    SELECT run_id, flags FROM run_overview
),
wide AS (
    SELECT
        s.run_id, s.stage, s.level, s.class_name,
        s.ttft_p50_ms, s.ttft_p99_ms, s.ttft_p99_adj_ms, s.itl_p50_ms, s.itl_p99_ms,
        s.tpot_p50_ms, s.tpot_p99_ms, s.e2e_p50_ms, s.e2e_p99_ms, s.error_rate,
        s.output_tokens_per_s, s.output_tokens_per_s_per_gpu, s.requests_per_s, s.goodput,
        s.slo_attainment
    FROM stage_summary s
),
long AS (
    UNPIVOT wide
    ON ttft_p50_ms, ttft_p99_ms, ttft_p99_adj_ms, itl_p50_ms, itl_p99_ms,
       tpot_p50_ms, tpot_p99_ms, e2e_p50_ms, e2e_p99_ms, error_rate,
       output_tokens_per_s, output_tokens_per_s_per_gpu, requests_per_s, goodput, slo_attainment
    INTO NAME metric VALUE value
),
keyed AS (
    SELECT l.*, k.profile_name, k.variant, k.hardware, k.model, k.baseline_run
    FROM long l JOIN run_keys k USING (run_id)
),
noise AS (
    SELECT profile_name, variant, hardware, model, stage, class_name, metric,
           count(*) AS repeats,
           max(value) - min(value) AS spread
    FROM keyed
    GROUP BY ALL
)
SELECT
    c.profile_name,
    c.stage,
    c.level,
    c.class_name,
    c.metric,
    c.run_id,
    c.variant,
    fc.flags AS flags,
    c.value,
    c.baseline_run,
    b.variant AS baseline_variant,
    fb.flags AS baseline_flags,
    b.value AS baseline_value,
    CASE WHEN c.value = b.value THEN 1.0 ELSE c.value / nullif(b.value, 0) END AS ratio,
    CASE WHEN c.metric IN ('output_tokens_per_s', 'output_tokens_per_s_per_gpu', 'requests_per_s',
                           'goodput', 'slo_attainment') THEN 'higher' ELSE 'lower' END AS better,
    CASE WHEN c.metric IN ('output_tokens_per_s', 'output_tokens_per_s_per_gpu', 'requests_per_s',
                           'goodput', 'slo_attainment') THEN c.value > b.value
         ELSE c.value < b.value END AS improved,
    nc.repeats AS repeats,
    nb.repeats AS baseline_repeats,
    greatest(CASE WHEN nc.repeats > 1 THEN nc.spread END,
             CASE WHEN nb.repeats > 1 THEN nb.spread END) AS noise_band,
    CASE WHEN greatest(nc.repeats, nb.repeats) < 2 THEN NULL
         WHEN c.value = b.value THEN true
         ELSE abs(c.value - b.value) <= greatest(CASE WHEN nc.repeats > 1 THEN nc.spread END,
                                                 CASE WHEN nb.repeats > 1 THEN nb.spread END)
    END AS within_noise
FROM keyed c
JOIN keyed b
  ON b.run_id = c.baseline_run AND b.stage = c.stage AND b.class_name = c.class_name
 AND b.metric = c.metric
LEFT JOIN run_flags fc ON fc.run_id = c.run_id
LEFT JOIN run_flags fb ON fb.run_id = b.run_id
LEFT JOIN noise nc
  ON nc.profile_name IS NOT DISTINCT FROM c.profile_name AND nc.variant IS NOT DISTINCT FROM c.variant
 AND nc.hardware IS NOT DISTINCT FROM c.hardware AND nc.model IS NOT DISTINCT FROM c.model
 AND nc.stage = c.stage AND nc.class_name = c.class_name AND nc.metric = c.metric
LEFT JOIN noise nb
  ON nb.profile_name IS NOT DISTINCT FROM b.profile_name AND nb.variant IS NOT DISTINCT FROM b.variant
 AND nb.hardware IS NOT DISTINCT FROM b.hardware AND nb.model IS NOT DISTINCT FROM b.model
 AND nb.stage = b.stage AND nb.class_name = b.class_name AND nb.metric = b.metric;
