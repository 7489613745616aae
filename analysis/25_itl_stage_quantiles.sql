-- itl_stage_quantiles: ITL percentiles per run x stage x class (and class_name = '(all)') over the
-- measured, completed requests, for both ITL views, SKETCHED: method = 'ddsketch(1%)'.
--   view = 'token': the per-token gaps (g_i / k_i, counted k_i times); 'chunk': the chunk gaps g_i.
--   samples, mean_ms: EXACT (counts and sums: mean_ms = sum(g) / sum(k) token, avg(g) chunk).
--   p50_ms .. p99_ms: quantile_cont's definition (interpolation between the order statistics at
--   floor(h) and floor(h)+1, h = (samples - 1) q), each order statistic read from the merged
--   DDSketch of the group's requests (itl_sketches: bucket i holds (gamma^(i-1), gamma^i], gamma =
--   1.01/0.99, read as 2 gamma^i / (gamma + 1): the store's macros servelab_sketch_bin and
--   servelab_sketch_value, src/servelab/store/schema.sql). Each order statistic is then within 1%
--   of the true one (relative), and so is their interpolation, whatever the distribution; 0 is
--   exact.
--   itl_stage_quantiles_exact gives the exact figures (it reads every chunk gap).
-- Why a sketch: merging adds bucket counts, so a stage of a million requests x 256 chunks reads
-- about one row per (request, distinct bucket) instead of sorting 256 M samples.

-- servelab_sketch_quantile(bin, cum, total, q): an aggregate over a merged sketch's buckets, one
-- row per bucket with its count cumulated in bucket order (cum) and the sketch's sample count
-- (total): quantile_cont's interpolation between the order statistics at floor(h) and
-- floor(h) + 1 (h = (total - 1) q), the order statistic at rank r (0-based) being the value of the
-- first bucket whose cumulated count exceeds r. itl_stage_quantiles reads a stage's sketch with it
-- and the live window (30_stage_summary.sql) its last seconds'.
CREATE OR REPLACE MACRO servelab_sketch_quantile(bin, cum, total, q) AS
    servelab_sketch_value(min(bin) FILTER (WHERE cum > floor((total - 1) * q)))
    + (servelab_sketch_value(min(bin) FILTER (WHERE cum > least(floor((total - 1) * q) + 1,
                                                                 total - 1)))
       - servelab_sketch_value(min(bin) FILTER (WHERE cum > floor((total - 1) * q))))
      * ((max(total) - 1) * q - floor((max(total) - 1) * q));

CREATE OR REPLACE VIEW itl_stage_quantiles AS
WITH
req AS (
    SELECT s.*, r.stage, coalesce(r.class_name, '(none)') AS cls
    FROM itl_sketches s
    JOIN request_metrics r ON r.run_id = s.run_id AND r.request_id = s.request_id
    WHERE r.measured AND r.ok AND s.gaps > 0
),
sums AS (
    SELECT run_id, stage, CASE WHEN grouping(cls) = 1 THEN '(all)' ELSE cls END AS class_name,
           sum(gap_sum_ms) / sum(gap_tokens) AS token_mean, sum(gap_sum_ms) / sum(gaps) AS chunk_mean
    FROM req
    GROUP BY GROUPING SETS ((run_id, stage, cls), (run_id, stage))
),
class_bins AS (
    SELECT run_id, stage, cls AS class_name, view, bin, sum(n) AS n
    FROM (
        SELECT run_id, stage, cls, 'token' AS view,
               unnest(map_keys(token_sketch)) AS bin, unnest(map_values(token_sketch)) AS n
        FROM req
        UNION ALL
        SELECT run_id, stage, cls, 'chunk' AS view,
               unnest(map_keys(chunk_sketch)) AS bin, unnest(map_values(chunk_sketch)) AS n
        FROM req
    )
    GROUP BY run_id, stage, cls, view, bin
),
bins AS (
    -- '(all)' adds the classes' merged counts (integers: the same as adding every request's), so
    -- the per-request bucket rows are aggregated once, not once per grouping
    SELECT * FROM class_bins
    UNION ALL
    SELECT run_id, stage, '(all)' AS class_name, view, bin, sum(n) AS n
    FROM class_bins
    GROUP BY run_id, stage, view, bin
),
cumulative AS (
    SELECT *,
           sum(n) OVER (PARTITION BY run_id, stage, class_name, view ORDER BY bin
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
           sum(n) OVER (PARTITION BY run_id, stage, class_name, view) AS total
    FROM bins
),
percentiles AS (
    SELECT run_id, stage, class_name, view, any_value(total) AS total,
           servelab_sketch_quantile(bin, cum, total, 0.5) AS p50_ms,
           servelab_sketch_quantile(bin, cum, total, 0.9) AS p90_ms,
           servelab_sketch_quantile(bin, cum, total, 0.95) AS p95_ms,
           servelab_sketch_quantile(bin, cum, total, 0.99) AS p99_ms
    FROM cumulative
    GROUP BY run_id, stage, class_name, view
)
SELECT
    p.run_id,
    p.stage,
    p.class_name,
    p.view,
    p.total AS samples,
    CASE WHEN p.view = 'token' THEN s.token_mean ELSE s.chunk_mean END AS mean_ms,
    p.p50_ms, p.p90_ms, p.p95_ms, p.p99_ms,
    'ddsketch(1%)' AS method
FROM percentiles p
LEFT JOIN sums s ON s.run_id = p.run_id AND s.stage = p.stage AND s.class_name = p.class_name;
