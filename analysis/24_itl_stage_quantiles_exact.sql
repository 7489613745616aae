-- itl_stage_quantiles_exact: the EXACT ITL percentiles (what `--exact` reads; itl_stage_quantiles,
-- which stage_summary reads, merges per-request sketches instead) per run x stage x class (and class_name = '(all)') over
-- the measured, completed requests, for both ITL views:
--   view = 'token': samples = per-token gaps of itl_tokens (itl_ms, each chunk gap counted once per
--                   token), mean_ms = sum(gap_ms) / sum(tokens);
--   view = 'chunk': samples = chunk gaps of itl_chunks (gap_ms), mean_ms = avg(gap_ms).
--   p50_ms .. p99_ms are EXACTLY quantile_cont over those samples (linear interpolation between the
--   order statistics at floor(h) and floor(h)+1, h = (samples - 1) q).
-- How (so that a run of a million requests x 256 chunks needs no gigabytes of sort buffers):
--   pass 1 counts the samples (token view: weight = tokens of the chunk) in fine value bins
--   (servelab_value_bin: 256 bins per octave of milliseconds) and finds, from the cumulative counts,
--   the bin and the rank inside it of each order statistic that a percentile needs;
--   pass 2 reads back only the samples in those bins, orders them, and picks the values.
-- The token view never materialises the repeated rows: a chunk's weight is its token count.
CREATE OR REPLACE MACRO servelab_value_bin(v) AS
    CASE WHEN v IS NULL OR isnan(v) THEN NULL
         WHEN v = 'infinity'::DOUBLE THEN 100000000
         WHEN v > 0 THEN CAST(floor(log2(v) * 256) AS BIGINT)
         WHEN v = 0 THEN -100000000
         ELSE -200000000 END;

-- servelab_itl_samples(second_pass): what both passes read, each chunk gap of the measured,
-- completed requests twice, as a token-view sample (v = itl_ms, weight w = tokens) and as a
-- chunk-view sample (v = gap_ms, w = 1), with its value bin. second_pass adds the always-true
-- `request_id IS NOT NULL` (why: pass 2 below).
CREATE OR REPLACE MACRO servelab_itl_samples(second_pass) AS TABLE
    SELECT run_id, stage, cls, view, v, w, servelab_value_bin(v) AS bin
    FROM (
        SELECT run_id, stage, coalesce(class_name, '(none)') AS cls,
               unnest(['token', 'chunk']) AS view,
               unnest([itl_ms, gap_ms]) AS v,
               unnest([tokens, 1]) AS w
        FROM itl_chunks
        WHERE measured AND ok AND (NOT second_pass OR request_id IS NOT NULL)
    );

-- servelab_itl_percentiles(value, q): the p50_ms, p90_ms, p95_ms and p99_ms columns of both ITL
-- views (token and chunk), from a group's rows of (q, value); UNNEST spreads the struct into
-- those columns.
CREATE OR REPLACE MACRO servelab_itl_percentiles(value, q) AS {
    'p50_ms': max(value) FILTER (WHERE q = 0.5),
    'p90_ms': max(value) FILTER (WHERE q = 0.9),
    'p95_ms': max(value) FILTER (WHERE q = 0.95),
    'p99_ms': max(value) FILTER (WHERE q = 0.99)};

CREATE OR REPLACE VIEW itl_stage_quantiles_exact AS
WITH
bins AS (
    SELECT
        run_id, stage,
        CASE WHEN grouping(cls) = 1 THEN '(all)' ELSE cls END AS class_name,
        view, bin,
        sum(w) AS n,
        sum(v * w) AS weighted_sum
    FROM servelab_itl_samples(false)  -- pass 1
    GROUP BY GROUPING SETS ((run_id, stage, cls, view, bin), (run_id, stage, view, bin))
),
totals AS (
    SELECT run_id, stage, class_name, view, sum(n) AS total, sum(weighted_sum) / sum(n) AS mean_ms
    FROM bins
    GROUP BY run_id, stage, class_name, view
),
cumulative AS (
    SELECT *,
           sum(n) OVER (PARTITION BY run_id, stage, class_name, view ORDER BY bin
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - n AS before
    FROM bins
),
wanted AS (
    -- the 0-based positions of the two order statistics each percentile interpolates between
    SELECT t.run_id, t.stage, t.class_name, t.view, q.q,
           (t.total - 1) * q.q AS h,
           unnest([floor((t.total - 1) * q.q), least(floor((t.total - 1) * q.q) + 1, t.total - 1)]) AS pos
    FROM totals t
    CROSS JOIN (SELECT unnest([0.5, 0.9, 0.95, 0.99]::DOUBLE[]) AS q) q
),
located AS (
    SELECT DISTINCT w.run_id, w.stage, w.class_name, w.view, w.q, w.h, w.pos, c.bin, w.pos - c.before AS rank_in_bin
    FROM wanted w
    JOIN cumulative c
      ON c.run_id = w.run_id AND c.stage = w.stage AND c.class_name = w.class_name AND c.view = w.view
     AND w.pos >= c.before AND w.pos < c.before + c.n
),
target_bins AS (
    SELECT DISTINCT run_id, stage, view, bin FROM located
),
picked AS (
    -- pass 2: the same samples again, keeping only those in a bin that holds a wanted order
    -- statistic. Read twice on purpose: given a shared CTE, or two identical subqueries, DuckDB 1.5
    -- caches every sample of pass 1 for pass 2 (its common-subplan optimisation), which is the
    -- memory this view exists to avoid. The always-true `request_id IS NOT NULL` of second_pass
    -- makes the two scans differ down to the table, so nothing is cached. (Still so on 1.5.6:
    -- without it, EXPLAIN shows half the table scans and the samples read back from a shared CTE.)
    SELECT s.run_id, s.stage, unnest([s.cls, '(all)']) AS class_name, s.view, s.bin, s.v, s.w
    FROM servelab_itl_samples(true) s
    SEMI JOIN target_bins t ON t.run_id = s.run_id AND t.stage = s.stage AND t.view = s.view AND t.bin = s.bin
),
ordered AS (
    SELECT p.*,
           sum(p.w) OVER (PARTITION BY p.run_id, p.stage, p.class_name, p.view, p.bin ORDER BY p.v
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto
    FROM picked p
    SEMI JOIN (SELECT DISTINCT run_id, stage, class_name, view, bin FROM located) l
      ON l.run_id = p.run_id AND l.stage = p.stage AND l.class_name = p.class_name AND l.view = p.view
     AND l.bin = p.bin
),
values_at AS (
    -- the order statistic at rank r of a bin is the first value whose running weight exceeds r
    SELECT l.run_id, l.stage, l.class_name, l.view, l.q, l.h, l.pos, min(o.v) AS value
    FROM located l
    JOIN ordered o
      ON o.run_id = l.run_id AND o.stage = l.stage AND o.class_name = l.class_name AND o.view = l.view
     AND o.bin = l.bin AND o.upto > l.rank_in_bin
    GROUP BY l.run_id, l.stage, l.class_name, l.view, l.q, l.h, l.pos
),
percentiles AS (
    SELECT run_id, stage, class_name, view, q,
           CASE WHEN min(value) = max(value) OR any_value(h) = min(pos) THEN arg_min(value, pos)
                ELSE arg_min(value, pos) + (arg_max(value, pos) - arg_min(value, pos)) * (any_value(h) - min(pos))
           END AS value
    FROM values_at
    GROUP BY run_id, stage, class_name, view, q
)
SELECT
    t.run_id,
    t.stage,
    t.class_name,
    t.view,
    t.total AS samples,
    t.mean_ms,
    UNNEST(servelab_itl_percentiles(p.value, p.q)),
    'exact' AS method
FROM totals t
LEFT JOIN percentiles p
       ON p.run_id = t.run_id AND p.stage = t.stage AND p.class_name = t.class_name AND p.view = t.view
GROUP BY t.run_id, t.stage, t.class_name, t.view, t.total, t.mean_ms;
