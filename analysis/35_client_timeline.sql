-- client_timeline: one row per run x wall-clock second (t_unix = floor of the event time), what
-- the load generator saw, to lay beside server_timeline (a cause next to its effect):
--   requests_sent, errors                 requests by floor(sent_unix) (dropped arrivals left out);
--   ttft_p50_ms/ttft_p99_ms, e2e_p50_ms/e2e_p99_ms
--                                         completed requests by the second they were SENT;
--   output_tokens                         sum(chunk_arrivals.usage_tokens) by the second chunks ARRIVED;
--   itl_p50_ms/itl_p99_ms                 itl_tokens (per-token view) by the second the chunk arrived;
--   cpu_percent_max, loop_lag_max_ms, backlog, in_flight
--                                         client_health: worst worker in the second; backlog and
--                                         in_flight summed over workers (each worker's last sample).
-- Warm-up and cool-down are included (the report shades the measured windows); stage as in
-- server_timeline; measured = t_unix in the measure window. t_rel_s = t_unix - runs.started_unix.
CREATE OR REPLACE VIEW client_timeline AS
WITH
sent AS (
    SELECT run_id, floor(sent_unix) AS t_unix,
           count(*) AS requests_sent,
           count(*) FILTER (WHERE NOT ok) AS errors,
           quantile_cont(ttft_ms, [0.5, 0.99]) FILTER (WHERE ok) AS ttft_q,
           quantile_cont(e2e_ms, [0.5, 0.99]) FILTER (WHERE ok) AS e2e_q
    FROM request_metrics
    WHERE sent_unix IS NOT NULL AND NOT dropped
    GROUP BY run_id, floor(sent_unix)
),
tokens AS (
    SELECT run_id, floor(arrival_unix) AS t_unix, sum(usage_tokens) AS output_tokens
    FROM chunk_arrivals
    GROUP BY run_id, floor(arrival_unix)
),
itl AS (
    SELECT run_id, floor(arrival_unix) AS t_unix, quantile_cont(itl_ms, [0.5, 0.99]) AS itl_q
    FROM itl_tokens
    GROUP BY run_id, floor(arrival_unix)
),
health_last AS (
    SELECT run_id, worker, floor(t_unix) AS t_unix,
           max(cpu_percent) AS cpu_percent, max(loop_lag_ms) AS loop_lag_ms,
           arg_max(backlog, t_unix) AS backlog, arg_max(in_flight, t_unix) AS in_flight
    FROM client_health
    GROUP BY run_id, worker, floor(t_unix)
),
health AS (
    SELECT run_id, t_unix, max(cpu_percent) AS cpu_percent_max, max(loop_lag_ms) AS loop_lag_max_ms,
           sum(backlog) AS backlog, sum(in_flight) AS in_flight
    FROM health_last
    GROUP BY run_id, t_unix
),
keys AS (
    SELECT run_id, t_unix FROM sent
    UNION SELECT run_id, t_unix FROM tokens
    UNION SELECT run_id, t_unix FROM itl
    UNION SELECT run_id, t_unix FROM health
),
joined AS (
    SELECT
        k.run_id,
        k.t_unix,
        coalesce(s.requests_sent, 0) AS requests_sent,
        coalesce(s.errors, 0) AS errors,
        s.ttft_q[1] AS ttft_p50_ms,
        s.ttft_q[2] AS ttft_p99_ms,
        s.e2e_q[1] AS e2e_p50_ms,
        s.e2e_q[2] AS e2e_p99_ms,
        coalesce(t.output_tokens, 0) AS output_tokens,
        i.itl_q[1] AS itl_p50_ms,
        i.itl_q[2] AS itl_p99_ms,
        h.cpu_percent_max,
        h.loop_lag_max_ms,
        h.backlog,
        h.in_flight
    FROM keys k
    LEFT JOIN sent s ON s.run_id = k.run_id AND s.t_unix = k.t_unix
    LEFT JOIN tokens t ON t.run_id = k.run_id AND t.t_unix = k.t_unix
    LEFT JOIN itl i ON i.run_id = k.run_id AND i.t_unix = k.t_unix
    LEFT JOIN health h ON h.run_id = k.run_id AND h.t_unix = k.t_unix
)
SELECT
    j.run_id,
    j.t_unix,
    j.t_unix - ru.started_unix AS t_rel_s,
    CASE WHEN j.t_unix < coalesce(st.ended_unix, 'infinity'::DOUBLE) THEN st.stage END AS stage,
    coalesce(j.t_unix >= st.measure_start_unix AND j.t_unix < st.measure_end_unix, false) AS measured,
    j.* EXCLUDE (run_id, t_unix)
FROM joined j
LEFT JOIN runs ru ON ru.run_id = j.run_id
ASOF LEFT JOIN stages st ON st.run_id = j.run_id AND j.t_unix >= st.started_unix;
