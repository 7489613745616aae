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
--                                                  every verification step yields, as vLLM's log).
CREATE OR REPLACE MACRO servelab_share(part, whole) AS part / nullif(whole, 0);
CREATE OR REPLACE MACRO servelab_acceptance_length(accepted, drafts) AS 1 + accepted / nullif(drafts, 0);

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
