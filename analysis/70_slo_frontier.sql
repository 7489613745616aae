-- slo_frontier: per run x class (and '(all)'), what a load sweep (the run's stages, ordered by
-- level: users for concurrency stages, requests/s for rate stages) says about capacity.
--   target = 0.9 in the view; slo_frontier_at(target) is the same table for any target, e.g.
--     SELECT * FROM slo_frontier_at(0.95).
--   Only stages with requests > 0 and a level count.
--   first_failing_level = lowest level whose slo_attainment < target.
--   max_level_meeting_target = highest level whose slo_attainment >= target AND that is below
--     first_failing_level: the load the server sustains before attainment first drops below the
--     target (a later level that passes again does not count). goodput_at_max_level and
--     output_tokens_per_s_at_max_level are stage_summary's figures at that level.
--   slo_ttft_ms = the class's TTFT SLO; for '(all)' the strictest (smallest) of the run's classes.
--   knee_level = lowest level whose error-adjusted p99 TTFT (ttft_p99_adj_ms: a failure counts as
--     infinitely slow) exceeds slo_ttft_ms: where p99 TTFT leaves its SLO.
--   last_level_within_slo = highest level below knee_level; knee_level_interp = the level where
--     the straight line between (last_level_within_slo, its p99) and (knee_level, its p99) crosses
--     slo_ttft_ms (NULL when the knee's p99 is infinite or there is no level before the knee).
-- Where several stages share a level, the worst figure at that level counts.
CREATE OR REPLACE MACRO slo_frontier_at(target) AS TABLE
WITH
slo AS (
    SELECT run_id, class_name, slo_ttft_ms FROM run_classes
    UNION ALL
    SELECT run_id, '(all)' AS class_name, min(slo_ttft_ms) AS slo_ttft_ms FROM run_classes GROUP BY run_id
),
per_level AS (
    SELECT
        s.run_id, s.class_name, s.level,
        any_value(s.kind) AS kind,
        min(s.slo_attainment) AS slo_attainment,
        min(s.goodput) AS goodput,
        min(s.output_tokens_per_s) AS output_tokens_per_s,
        max(s.ttft_p99_adj_ms) AS ttft_p99_adj_ms
    FROM stage_summary s
    WHERE s.requests > 0 AND s.level IS NOT NULL
    GROUP BY s.run_id, s.class_name, s.level
),
marks AS (
    SELECT
        p.run_id, p.class_name,
        any_value(p.kind) AS kind,
        count(*) AS levels,
        min(p.level) AS min_level,
        max(p.level) AS max_level,
        any_value(sl.slo_ttft_ms) AS slo_ttft_ms,
        min(p.level) FILTER (WHERE p.slo_attainment < target) AS first_failing_level,
        min(p.level) FILTER (WHERE p.ttft_p99_adj_ms > sl.slo_ttft_ms) AS knee_level
    FROM per_level p
    LEFT JOIN slo sl ON sl.run_id = p.run_id AND sl.class_name = p.class_name
    GROUP BY p.run_id, p.class_name
),
passing AS (
    SELECT
        p.run_id, p.class_name,
        max(p.level) AS max_level_meeting_target,
        arg_max(p.goodput, p.level) AS goodput_at_max_level,
        arg_max(p.output_tokens_per_s, p.level) AS output_tokens_per_s_at_max_level
    FROM per_level p
    JOIN marks m ON m.run_id = p.run_id AND m.class_name = p.class_name
    WHERE p.slo_attainment >= target AND p.level < coalesce(m.first_failing_level, 'infinity'::DOUBLE)
    GROUP BY p.run_id, p.class_name
),
knee AS (
    SELECT
        m.run_id, m.class_name,
        max(p.level) FILTER (WHERE p.level < m.knee_level) AS last_level_within_slo,
        arg_max(p.ttft_p99_adj_ms, p.level) FILTER (WHERE p.level < m.knee_level) AS p99_before,
        max(p.ttft_p99_adj_ms) FILTER (WHERE p.level = m.knee_level) AS p99_at_knee
    FROM marks m
    JOIN per_level p ON p.run_id = m.run_id AND p.class_name = m.class_name
    GROUP BY m.run_id, m.class_name
)
SELECT
    m.run_id,
    m.class_name,
    m.kind,
    CAST(target AS DOUBLE) AS target,
    m.levels,
    m.min_level,
    m.max_level,
    pa.max_level_meeting_target,
    pa.goodput_at_max_level,
    pa.output_tokens_per_s_at_max_level,
    m.first_failing_level,
    m.slo_ttft_ms,
    m.knee_level,
    k.last_level_within_slo,
    CASE WHEN k.last_level_within_slo IS NOT NULL AND isfinite(k.p99_at_knee)
              AND k.p99_at_knee > k.p99_before
         THEN k.last_level_within_slo + (m.slo_ttft_ms - k.p99_before)
              * (m.knee_level - k.last_level_within_slo) / (k.p99_at_knee - k.p99_before)
    END AS knee_level_interp
FROM marks m
LEFT JOIN passing pa ON pa.run_id = m.run_id AND pa.class_name = m.class_name
LEFT JOIN knee k ON k.run_id = m.run_id AND k.class_name = m.class_name;

CREATE OR REPLACE VIEW slo_frontier AS SELECT * FROM slo_frontier_at(0.9);
