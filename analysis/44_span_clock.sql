-- span_clock: the clock offset theta between the server of a run and its client (server clock -
-- client clock, ms), one row per run with joined spans; every phase of request_phases uses it.
--   fwd_min_ms = min over joined requests of 1000*(span start - sent_unix)   (>= theta)
--   bwd_min_ms = min of 1000*(first_token_unix - server first output)        (>= -theta)
--     where server first output = span start + time_to_first_token_s. The first token, not the
--     last: the client's last chunk carrying text can come before the server's last output
--     (tokens whose bytes end no character yet carry no text, so a stream's tail can be text-
--     less); measured on an H200 (vLLM 0.26, random weights), up to 286 ms, which made one run's
--     bounds contradict and its offset 143 ms on the same host. The first text chunk can only
--     come after the server's first output.
--   same host (the run's target is 127.0.0.1, localhost or [::1]) and 0 within
--     [-bwd_min_ms - 2, fwd_min_ms + 2]: theta = 0, clock_offset_source 'same_host'. The 2 ms:
--     one host is one clock, but the client stamps on perf_counter from one wall-clock reading
--     at its start (loadgen/client/clock.py) and the server on its own wall-clock reads, which
--     NTP's slewing moves apart by up to 0.5 ms a second; on a loaded 2-core machine the
--     bounds of a same-host run were seen to miss 0 by 0.25-0.6 ms;
--   else theta = (fwd_min_ms - bwd_min_ms) / 2 (NTP's midpoint of the smallest delays each
--     way), 'min_delay_midpoint', within [clock_offset_lo_ms, clock_offset_hi_ms] =
--     [-bwd_min_ms, fwd_min_ms]. Columns clock_offset_ms, _lo_ms, _hi_ms, _source on every row.
CREATE OR REPLACE VIEW span_clock AS
WITH firsts AS (
    SELECT * FROM server_spans
    WHERE request_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY run_id, request_id
                               ORDER BY received_unix, start_unix) = 1
),
delays AS (
    SELECT s.run_id,
        min(1000 * (s.start_unix - r.sent_unix)) AS fwd_min_ms,
        min(1000 * (r.first_token_unix - (s.start_unix + s.time_to_first_token_s)))
            AS bwd_min_ms,
        count(*) AS joined
    FROM firsts s
    JOIN requests r ON r.run_id = s.run_id AND r.request_id = s.request_id
    WHERE r.sent_unix IS NOT NULL AND r.first_token_unix IS NOT NULL
        AND s.time_to_first_token_s IS NOT NULL
    GROUP BY s.run_id
)
SELECT d.run_id, d.joined, d.fwd_min_ms, d.bwd_min_ms,
    -d.bwd_min_ms AS clock_offset_lo_ms,
    d.fwd_min_ms AS clock_offset_hi_ms,
    CASE WHEN loopback AND 0 BETWEEN -d.bwd_min_ms - 2 AND d.fwd_min_ms + 2 THEN 0.0
         ELSE (d.fwd_min_ms - d.bwd_min_ms) / 2 END AS clock_offset_ms,
    CASE WHEN loopback AND 0 BETWEEN -d.bwd_min_ms - 2 AND d.fwd_min_ms + 2 THEN 'same_host'
         ELSE 'min_delay_midpoint' END AS clock_offset_source
FROM delays d
LEFT JOIN (SELECT run_id, regexp_matches(coalesce(target, ''),
                  '^[a-z]+://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]+)?(/|$)') AS loopback
           FROM runs) t USING (run_id);
