-- itl_stage_quantiles: ITL percentiles per run x stage x class (and class_name = '(all)') over the
-- measured, completed requests, for both ITL views, SKETCHED: method = 'ddsketch(1%)'.
--   view = 'token': the per-token gaps (g_i / k_i, counted k_i times); 'chunk': the chunk gaps g_i.
--   samples, mean_ms: EXACT (counts and sums: mean_ms = sum(g) / sum(k) token, avg(g) chunk).
--   p50_ms .. p99_ms: quantile_cont's definition (interpolation between the order statistics at
--   floor(h) and floor(h)+1, h = (samples - 1) q), each order statistic read from the merged
--   DDSketch of the group's requests (itl_sketches: bucket i holds (gamma^(i-1), gamma^i], gamma =
--   1.01/0.99, read as 2 gamma^i / (gamma + 1)). Each order statistic is then within 1% of the true
--   one (relative), and so is their interpolation, whatever the distribution; 0 is exact.
--   itl_stage_quantiles_exact gives the exact figures (it reads every chunk gap).
-- Why a sketch: merging adds bucket counts, so a stage of a million requests x 256 chunks reads
-- about one row per (request, distinct bucket) instead of sorting 256 M samples.
CREATE OR REPLACE MACRO servelab_sketch_value(b) AS
    CASE WHEN b = -500000 THEN 0.0
         WHEN b < -500000 THEN -2 * pow(1.01 / 0.99, -1000000 - b) / (1.01 / 0.99 + 1)
         ELSE 2 * pow(1.01 / 0.99, b) / (1.01 / 0.99 + 1) END;

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
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - n AS before,
           sum(n) OVER (PARTITION BY run_id, stage, class_name, view) AS total
    FROM bins
),
wanted AS (
    SELECT DISTINCT run_id, stage, class_name, view, total FROM cumulative
),
positions AS (
    SELECT w.*, q.q, (w.total - 1) * q.q AS h,
           unnest([floor((w.total - 1) * q.q), least(floor((w.total - 1) * q.q) + 1, w.total - 1)]) AS pos
    FROM wanted w
    CROSS JOIN (SELECT unnest([0.5, 0.9, 0.95, 0.99]::DOUBLE[]) AS q) q
),
located AS (
    SELECT p.run_id, p.stage, p.class_name, p.view, p.q, p.h, p.pos, servelab_sketch_value(c.bin) AS value
    FROM positions p
    JOIN cumulative c
      ON c.run_id = p.run_id AND c.stage = p.stage AND c.class_name = p.class_name AND c.view = p.view
     AND p.pos >= c.before AND p.pos < c.before + c.n
),
percentiles AS (
    SELECT run_id, stage, class_name, view, q,
           arg_min(value, pos) + (arg_max(value, pos) - arg_min(value, pos)) * (any_value(h) - min(pos)) AS value
    FROM located
    GROUP BY run_id, stage, class_name, view, q
)
SELECT
    w.run_id,
    w.stage,
    w.class_name,
    w.view,
    w.total AS samples,
    CASE WHEN w.view = 'token' THEN s.token_mean ELSE s.chunk_mean END AS mean_ms,
    UNNEST(servelab_itl_percentiles(p.value, p.q)),
    'ddsketch(1%)' AS method
FROM wanted w
LEFT JOIN sums s ON s.run_id = w.run_id AND s.stage = w.stage AND s.class_name = w.class_name
LEFT JOIN percentiles p
       ON p.run_id = w.run_id AND p.stage = w.stage AND p.class_name = w.class_name AND p.view = w.view
GROUP BY w.run_id, w.stage, w.class_name, w.view, w.total, s.token_mean, s.chunk_mean;
