-- run_overview: one row per run, what `servelab runs` lists.
--   requests / errors / warmup_requests = rows of `requests` (all stages, warm-up included);
--   stages, min_level, max_level from `stages`; duration_s = finished_unix - started_unix.
--   rows_lost = sum over workers of greatest(produced - stored, 0) + in_flight_lost (run_workers):
--     rows produced but not stored, plus requests in flight when a worker was lost;
--   flags = runs.flags, plus 'rows_lost' when rows_lost > 0 and the writer did not flag it
--     (servelab verify / matrix add 'unverified' or 'variant_mismatch' to runs.flags);
--   verification_status = runs.verification->>'status' (verified | mismatch | unverified |
--     failed_to_start; NULL when the run was never checked);
--   verified = verification_status = 'verified' (false when never checked).
CREATE OR REPLACE VIEW run_overview AS
WITH
req AS (
    SELECT run_id,
           count(*) AS requests,
           count(*) FILTER (WHERE error_kind IS NOT NULL) AS errors,
           count(*) FILTER (WHERE warmup) AS warmup_requests
    FROM requests
    GROUP BY run_id
),
st AS (
    SELECT run_id, count(*) AS stages, min(level) AS min_level, max(level) AS max_level
    FROM stages
    GROUP BY run_id
),
wk AS (
    SELECT run_id,
           sum(greatest(produced - stored, 0) + coalesce(in_flight_lost, 0)) AS rows_lost,
           sum(in_flight_lost) AS in_flight_lost
    FROM run_workers
    GROUP BY run_id
)
SELECT
    r.run_id,
    make_timestamp(CAST(r.started_unix * 1e6 AS BIGINT)) AS started_utc,
    r.started_unix,
    r.finished_unix - r.started_unix AS duration_s,
    r.profile_name,
    r.variant,
    r.hardware,
    r.model,
    r.gpus,
    r.target,
    r.load_kind,
    r.status,
    coalesce(req.requests, 0) AS requests,
    coalesce(req.errors, 0) AS errors,
    coalesce(req.warmup_requests, 0) AS warmup_requests,
    coalesce(st.stages, 0) AS stages,
    st.min_level,
    st.max_level,
    wk.rows_lost,
    wk.in_flight_lost,
    CASE WHEN coalesce(wk.rows_lost, 0) > 0 AND NOT list_contains(coalesce(r.flags, []), 'rows_lost')
         THEN list_append(coalesce(r.flags, []), 'rows_lost')
         ELSE coalesce(r.flags, []) END AS flags,
    r.tags,
    r.verification->>'status' AS verification_status,
    coalesce(r.verification->>'status' = 'verified', false) AS verified
FROM runs r
LEFT JOIN req ON req.run_id = r.run_id
LEFT JOIN st ON st.run_id = r.run_id
LEFT JOIN wk ON wk.run_id = r.run_id;
