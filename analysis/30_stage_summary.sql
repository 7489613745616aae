-- stage_summary: one row per run x stage x class, plus a class_name = '(all)' row per run x stage
-- (every stage of `stages` gets its '(all)' row, even with no requests).
-- Which requests count: request_metrics.measured AND NOT dropped, i.e. not warm-up and sent in
--   the stage's measured window [measure_start_unix, measure_end_unix); requests sent during
--   cool-down or before the window are left out. A dropped open-loop arrival is never sent: it
--   is counted in `dropped` only.
-- window_s = measure_end_unix - measure_start_unix (NULL when the stage has no window: rates NULL).
-- Latency percentiles (p50/p90/p95/p99, DuckDB quantile_cont = linear interpolation between
--   order statistics, like numpy's default) are over completed requests (ok):
--   ttft_*, tpot_*, e2e_* from request_metrics; itl_* = the token view (itl_tokens: one sample per
--   token), itl_chunk_* = the chunk view (itl_chunks: one sample per chunk gap) for contrast, both
--   from itl_stage_quantiles: means exact, percentiles SKETCHED (DDSketch, within 1% relative of
--   quantile_cont over those views; itl_quantile_method says so; itl_stage_quantiles_exact and
--   `servelab summary --exact` give the exact ones).
-- Error-adjusted percentiles *_adj_ms: over ALL counted requests with a failed request's value
--   taken as +infinity (infinitely slow), so p99_adj is infinite once more than ~1% fail.
-- Throughput: output_tokens_per_s = sum(chunk_arrivals.usage_tokens of chunks that ARRIVED in the
--   window, from any request of the run and class) / window_s. Counting arrivals inside the window
--   leaves out warm-up and cool-down output by construction and counts what the server produced
--   in the window, whichever request it belonged to.
--   output_tokens_per_s_per_gpu = output_tokens_per_s / runs.gpus;
--   output_tokens_per_s_per_user = 1000 / tpot_mean_ms (the decode pace one user sees).
-- requests_per_s = requests / window_s; completed_per_s = completed / window_s.
-- goodput = (completed requests meeting every SLO of their class) / window_s.
-- slo_attainment = requests meeting every SLO / requests (failures included in the denominator);
--   <slo>_attainment likewise for one SLO, over requests whose class sets it.
-- error_rate = errors / requests.
-- The latency figures, defined once for stage_summary and phase_stage_summary (45): aggregates
-- returning a struct, which a view spreads into columns with COLUMNS(s.*) AS '<figure>_\0':
--   servelab_latency(x, keep)   = {mean_ms, p50_ms, p90_ms, p95_ms, p99_ms} of x over rows kept;
--   servelab_latency_adj(x, ok) = {p50_adj_ms, p90_adj_ms, p99_adj_ms} of x over every row, a row
--                                 not ok counting as +infinity (the error-adjusted percentiles);
--   servelab_p50_p99(x, keep)   = {p50_ms, p99_ms} of x over rows kept (keep: all by default).
-- The percentiles index one list-valued quantile_cont, which DuckDB computes once per group.
CREATE OR REPLACE MACRO servelab_latency(x, keep) AS {
    'mean_ms': avg(x) FILTER (WHERE keep),
    'p50_ms': (quantile_cont(x, [0.5, 0.9, 0.95, 0.99]) FILTER (WHERE keep))[1],
    'p90_ms': (quantile_cont(x, [0.5, 0.9, 0.95, 0.99]) FILTER (WHERE keep))[2],
    'p95_ms': (quantile_cont(x, [0.5, 0.9, 0.95, 0.99]) FILTER (WHERE keep))[3],
    'p99_ms': (quantile_cont(x, [0.5, 0.9, 0.95, 0.99]) FILTER (WHERE keep))[4]};
CREATE OR REPLACE MACRO servelab_latency_adj(x, ok) AS {
    'p50_adj_ms': quantile_cont(CASE WHEN ok THEN x ELSE 'infinity'::DOUBLE END, [0.5, 0.9, 0.99])[1],
    'p90_adj_ms': quantile_cont(CASE WHEN ok THEN x ELSE 'infinity'::DOUBLE END, [0.5, 0.9, 0.99])[2],
    'p99_adj_ms': quantile_cont(CASE WHEN ok THEN x ELSE 'infinity'::DOUBLE END, [0.5, 0.9, 0.99])[3]};
CREATE OR REPLACE MACRO servelab_p50_p99(x, keep := true) AS {
    'p50_ms': (quantile_cont(x, [0.5, 0.99]) FILTER (WHERE keep))[1],
    'p99_ms': (quantile_cont(x, [0.5, 0.99]) FILTER (WHERE keep))[2]};

CREATE OR REPLACE VIEW stage_summary AS
WITH RECURSIVE
counted AS (
    SELECT *, coalesce(class_name, '(none)') AS cls
    FROM request_metrics
    WHERE measured AND NOT dropped
),
req_stats AS (
    SELECT
        run_id, stage,
        CASE WHEN grouping(cls) = 1 THEN '(all)' ELSE cls END AS class_name,
        count(*) AS requests,
        count(*) FILTER (WHERE ok) AS completed,
        count(*) FILTER (WHERE NOT ok) AS errors,
        histogram(error_kind) AS errors_by_kind,
        count(*) FILTER (WHERE arrival_status = 'late') AS late,
        count(*) FILTER (WHERE slo_met) AS slo_met_requests,
        avg(ttft_slo_met::INTEGER) AS ttft_slo_attainment,
        avg(tpot_slo_met::INTEGER) AS tpot_slo_attainment,
        avg(itl_slo_met::INTEGER) AS itl_slo_attainment,
        avg(e2e_slo_met::INTEGER) AS e2e_slo_attainment,
        servelab_latency(ttft_ms, ok) AS ttft,
        servelab_latency_adj(ttft_ms, ok) AS ttft_adj,
        servelab_latency(tpot_ms, ok) AS tpot,
        servelab_latency(e2e_ms, ok) AS e2e,
        servelab_latency_adj(e2e_ms, ok) AS e2e_adj,
        servelab_p50_p99(send_lag_ms) AS send_lag,
        max(send_lag_ms) AS send_lag_max_ms,
        servelab_p50_p99(ttft_sched_ms, ok) AS ttft_sched,
        servelab_p50_p99(e2e_sched_ms, ok) AS e2e_sched,
        avg(prompt_tokens) FILTER (WHERE ok) AS prompt_tokens_mean,
        avg(output_tokens) FILTER (WHERE ok) AS output_tokens_mean,
        avg(tokens_per_chunk) FILTER (WHERE ok) AS tokens_per_chunk_mean,
        sum(cached_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0)
            AS cached_prompt_share
    FROM counted
    GROUP BY GROUPING SETS ((run_id, stage, cls), (run_id, stage))
),
itl_stats AS (
    SELECT run_id, stage, class_name,
           max(mean_ms) FILTER (WHERE view = 'token') AS itl_mean_ms,
           max(p50_ms) FILTER (WHERE view = 'token') AS itl_p50_ms,
           max(p90_ms) FILTER (WHERE view = 'token') AS itl_p90_ms,
           max(p95_ms) FILTER (WHERE view = 'token') AS itl_p95_ms,
           max(p99_ms) FILTER (WHERE view = 'token') AS itl_p99_ms,
           max(mean_ms) FILTER (WHERE view = 'chunk') AS itl_chunk_mean_ms,
           max(p50_ms) FILTER (WHERE view = 'chunk') AS itl_chunk_p50_ms,
           max(p99_ms) FILTER (WHERE view = 'chunk') AS itl_chunk_p99_ms,
           any_value(method) AS itl_quantile_method
    FROM itl_stage_quantiles
    GROUP BY run_id, stage, class_name
),
windows AS (
    SELECT run_id, stage, kind, level, measure_start_unix, measure_end_unix,
           measure_end_unix - measure_start_unix AS window_s
    FROM stages
),
-- Throughput, per request: a request whose chunks all arrived inside the window contributes its
-- whole usage count, read from its chunk scalars (first_chunk_unix, last_chunk_unix,
-- chunk_tokens_total); only a request whose chunks straddle a window edge is read chunk by chunk.
-- The same sum as over chunk_arrivals, and computed at query time: a live run's windows are set
-- after its rows exist and may be cut short at Stop.
spans AS (
    SELECT w.run_id, w.stage, coalesce(r.class_name, '(none)') AS cls, r.request_rowid,
           w.measure_start_unix, w.measure_end_unix,
           r.first_chunk_unix >= w.measure_start_unix AND r.last_chunk_unix < w.measure_end_unix AS inside,
           r.first_chunk_unix < w.measure_start_unix AS crosses_start,
           coalesce(r.output_tokens, r.chunk_tokens_total) AS usage_total, r.chunk_tokens_total
    FROM windows w
    JOIN request_metrics r
      ON r.run_id = w.run_id
     AND r.first_chunk_unix < w.measure_end_unix
     AND r.last_chunk_unix >= w.measure_start_unix
    WHERE r.n_chunks > 0
),
-- The straddlers, numbered 1..N by the window edge they cross (the start edge for one that
-- crosses both). Rows are stored in the order they were written, so one edge's straddlers lie
-- close together in `requests`: fetching them one edge at a time (below) lets DuckDB's join
-- filter (the fetched rows' rowid range) skip every other row's chunk lists.
edge_rows AS MATERIALIZED (
    SELECT *, dense_rank() OVER (ORDER BY run_id, stage, crosses_start) AS edge
    FROM spans
    WHERE NOT inside
),
-- One edge per step: a step's output is that edge's straddlers (their classes and tokens in the
-- window, as lists); it stops after the last edge.
straddling(edge, run_id, stage, classes, tokens) AS (
    SELECT 0, NULL::VARCHAR, NULL::INTEGER, []::VARCHAR[], []::DOUBLE[]
    UNION ALL
    SELECT p.edge + 1, any_value(e.run_id), any_value(e.stage), list(e.cls),
           list(list_sum(list_transform(range(1, len(c.chunk_offsets_ms) + 1), lambda i:
               CASE WHEN c.sent_unix + c.chunk_offsets_ms[i] / 1000.0 >= e.measure_start_unix
                     AND c.sent_unix + c.chunk_offsets_ms[i] / 1000.0 < e.measure_end_unix
                    THEN servelab_chunk_weight(c.chunk_tokens[i]) ELSE 0 END))
               * e.usage_total / e.chunk_tokens_total)
    FROM straddling p
    JOIN edge_rows e ON e.edge = p.edge + 1
    JOIN requests c ON c.rowid = e.request_rowid
    GROUP BY p.edge
),
window_tokens AS (
    SELECT
        run_id, stage,
        CASE WHEN grouping(cls) = 1 THEN '(all)' ELSE cls END AS class_name,
        sum(tokens_in_window) AS output_tokens_in_window
    FROM (
        SELECT run_id, stage, cls, usage_total::DOUBLE AS tokens_in_window FROM spans WHERE inside
        UNION ALL
        SELECT run_id, stage, unnest(classes) AS cls, unnest(tokens) AS tokens_in_window
        FROM straddling WHERE edge > 0
    )
    GROUP BY GROUPING SETS ((run_id, stage, cls), (run_id, stage))
),
dropped_counts AS (
    SELECT
        run_id, stage,
        CASE WHEN grouping(cls) = 1 THEN '(all)' ELSE cls END AS class_name,
        count(*) AS dropped
    FROM (SELECT run_id, stage, coalesce(class_name, '(none)') AS cls
          FROM request_metrics WHERE measured AND dropped)
    GROUP BY GROUPING SETS ((run_id, stage, cls), (run_id, stage))
),
keys AS (
    SELECT run_id, stage, '(all)' AS class_name FROM stages
    UNION
    SELECT run_id, stage, class_name FROM req_stats
    UNION
    SELECT run_id, stage, class_name FROM dropped_counts
    UNION
    SELECT run_id, stage, class_name FROM window_tokens
)
SELECT
    k.run_id,
    k.stage,
    k.class_name,
    w.kind,
    w.level,
    w.measure_start_unix AS window_start_unix,
    w.measure_end_unix AS window_end_unix,
    w.window_s,
    coalesce(r.requests, 0) AS requests,
    coalesce(r.completed, 0) AS completed,
    coalesce(r.errors, 0) AS errors,
    r.errors_by_kind,
    coalesce(d.dropped, 0) AS dropped,
    coalesce(r.late, 0) AS late,
    COLUMNS(ttft.*) AS 'ttft_\0',
    COLUMNS(ttft_adj.*) AS 'ttft_\0',
    it.* EXCLUDE (run_id, stage, class_name),
    COLUMNS(tpot.*) AS 'tpot_\0',
    COLUMNS(e2e.*) AS 'e2e_\0',
    COLUMNS(e2e_adj.*) AS 'e2e_\0',
    COLUMNS(send_lag.*) AS 'send_lag_\0',
    r.send_lag_max_ms,
    COLUMNS(ttft_sched.*) AS 'ttft_sched_\0',
    COLUMNS(e2e_sched.*) AS 'e2e_sched_\0',
    r.prompt_tokens_mean,
    r.output_tokens_mean,
    r.tokens_per_chunk_mean,
    r.cached_prompt_share,
    coalesce(t.output_tokens_in_window, 0) AS output_tokens_in_window,
    coalesce(t.output_tokens_in_window, 0) / nullif(w.window_s, 0) AS output_tokens_per_s,
    coalesce(t.output_tokens_in_window, 0) / nullif(w.window_s, 0) / nullif(ru.gpus, 0)
        AS output_tokens_per_s_per_gpu,
    1000.0 / nullif(r.tpot.mean_ms, 0) AS output_tokens_per_s_per_user,
    coalesce(r.requests, 0) / nullif(w.window_s, 0) AS requests_per_s,
    coalesce(r.completed, 0) / nullif(w.window_s, 0) AS completed_per_s,
    coalesce(r.slo_met_requests, 0) AS slo_met_requests,
    coalesce(r.slo_met_requests, 0) / nullif(w.window_s, 0) AS goodput,
    r.slo_met_requests / nullif(r.requests, 0) AS slo_attainment,
    r.ttft_slo_attainment,
    r.tpot_slo_attainment,
    r.itl_slo_attainment,
    r.e2e_slo_attainment,
    r.errors / nullif(r.requests, 0) AS error_rate
FROM keys k
JOIN windows w ON w.run_id = k.run_id AND w.stage = k.stage
LEFT JOIN runs ru ON ru.run_id = k.run_id
LEFT JOIN req_stats r ON r.run_id = k.run_id AND r.stage = k.stage AND r.class_name = k.class_name
LEFT JOIN itl_stats it ON it.run_id = k.run_id AND it.stage = k.stage AND it.class_name = k.class_name
LEFT JOIN window_tokens t ON t.run_id = k.run_id AND t.stage = k.stage AND t.class_name = k.class_name
LEFT JOIN dropped_counts d ON d.run_id = k.run_id AND d.stage = k.stage AND d.class_name = k.class_name;

-- servelab_live_figures(run, spans, lo_min, sketch_lo_min, span_lo_min): the master's live window
-- (the web UI's LLM tab, the status file, the progress line) over the rows a run has stored so
-- far, with the definitions of request_metrics, stage_summary, itl_stage_quantiles and
-- request_phases; it differs from stage_summary only in which requests it counts: those stored
-- in a span of the `requests` table's rows (the master keeps, for each of its writes, how far
-- the tables reached), warm-up included, because the live view shows what is happening now.
--   spans         = list of {point, lo, hi, span_lo, span_hi}: rows lo <= rowid < hi of
--                   `requests` and span_lo <= rowid < span_hi of `server_spans` count for point
--                   (the master's last ten seconds, the rows not counted before, and each
--                   time-series point);
--   lo_min, sketch_lo_min, span_lo_min = the first rowid of `requests`, `itl_sketches` and
--                   `server_spans` any point reads (pushed into the scans: a statement reads
--                   only the last rows).
-- One row per point x class (and class_name = '(all)' for every point):
--   requests      = rows not dropped (a dropped open-loop arrival is counted in `dropped` only);
--   completed, errors (by kind), slo_met_requests as stage_summary's;
--   ttft, tpot, e2e = servelab_p50_p99 of request_metrics' columns over completed requests;
--   output_tokens = sum of coalesce(usage output_tokens, the chunks' token count) over the rows
--                   with content chunks (their whole output: the window is short, so no chunk
--                   arrival times are read);
--   itl_p50_ms, itl_p99_ms = the token view of itl_stage_quantiles: the merged sketches of the
--                   completed requests, read by servelab_sketch_quantile;
--   spans, queue_*, prefill_* = the server's spans of this run's requests (the first of each:
--                   not duplicate), request_phases' queue_ms and prefill_ms, servelab_p50_p99.
--   The ITL and span columns are the '(all)' row's.
-- Rates (per second) are the caller's: it knows how long each point's span of writes lasted.
CREATE OR REPLACE MACRO servelab_live_figures(run, spans, lo_min, sketch_lo_min, span_lo_min)
AS TABLE
WITH
points AS (
    SELECT unnest(spans, recursive := true)
),
counted AS (   -- the columns used, not r.*: two readers make DuckDB materialise it
    SELECT p.point, r.run_id, r.request_id, coalesce(r.class_name, '(none)') AS cls, r.ok,
           r.dropped, r.error_kind, r.slo_met, r.ttft_ms, r.tpot_ms, r.e2e_ms, r.output_tokens,
           r.chunk_tokens_total, r.n_chunks
    FROM request_metrics r
    JOIN points p ON r.request_rowid >= p.lo AND r.request_rowid < p.hi
    WHERE r.request_rowid >= lo_min AND r.run_id = run
),
req_stats AS (
    SELECT
        point,
        CASE WHEN grouping(cls) = 1 THEN '(all)' ELSE cls END AS class_name,
        count(*) FILTER (WHERE NOT dropped) AS requests,
        count(*) FILTER (WHERE ok) AS completed,
        count(*) FILTER (WHERE NOT ok AND NOT dropped) AS errors,
        histogram(error_kind) FILTER (WHERE NOT ok AND NOT dropped) AS errors_by_kind,
        count(*) FILTER (WHERE dropped) AS dropped,
        count(*) FILTER (WHERE slo_met) AS slo_met_requests,
        servelab_p50_p99(ttft_ms, ok) AS ttft,
        servelab_p50_p99(tpot_ms, ok) AS tpot,
        servelab_p50_p99(e2e_ms, ok) AS e2e,
        sum(coalesce(output_tokens, chunk_tokens_total))
            FILTER (WHERE n_chunks > 0 AND NOT dropped) AS output_tokens
    FROM counted
    GROUP BY GROUPING SETS ((point, cls), (point))
),
bins AS (
    SELECT point, bin, sum(n) AS n
    FROM (
        SELECT c.point, unnest(map_keys(s.token_sketch)) AS bin,
               unnest(map_values(s.token_sketch)) AS n
        FROM itl_sketches s
        JOIN counted c ON c.run_id = s.run_id AND c.request_id = s.request_id
        WHERE s.rowid >= sketch_lo_min AND c.ok AND s.gaps > 0
    )
    GROUP BY point, bin
),
cumulative AS (
    SELECT *,
           sum(n) OVER (PARTITION BY point ORDER BY bin
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
           sum(n) OVER (PARTITION BY point) AS total
    FROM bins
),
itl AS (
    SELECT point,
           servelab_sketch_quantile(bin, cum, total, 0.5) AS itl_p50_ms,
           servelab_sketch_quantile(bin, cum, total, 0.99) AS itl_p99_ms
    FROM cumulative
    GROUP BY point
),
span_stats AS (
    SELECT p.point, count(*) AS spans,
           servelab_p50_p99(1000 * s.time_in_queue_s) AS queue,
           servelab_p50_p99(1000 * s.time_in_model_prefill_s) AS prefill
    FROM server_spans s
    JOIN points p ON s.rowid >= p.span_lo AND s.rowid < p.span_hi
    WHERE s.rowid >= span_lo_min AND s.run_id = run AND s.request_id IS NOT NULL
      AND NOT coalesce(s.duplicate, false)
    GROUP BY p.point
),
rows AS (
    SELECT * FROM req_stats
    UNION ALL   -- every point's '(all)' row, where no request counted
    SELECT p.point, '(all)', 0, 0, 0, NULL, 0, 0, NULL, NULL, NULL, NULL
    FROM points p
    WHERE p.point NOT IN (SELECT point FROM req_stats)
)
SELECT
    r.point, r.class_name, r.requests, r.completed, r.errors, r.errors_by_kind, r.dropped,
    r.slo_met_requests, r.output_tokens,
    r.ttft.p50_ms AS ttft_p50_ms, r.ttft.p99_ms AS ttft_p99_ms,
    r.tpot.p50_ms AS tpot_p50_ms, r.e2e.p50_ms AS e2e_p50_ms,
    i.itl_p50_ms, i.itl_p99_ms,
    coalesce(sp.spans, 0) AS spans,
    sp.queue.p50_ms AS queue_p50_ms, sp.queue.p99_ms AS queue_p99_ms,
    sp.prefill.p50_ms AS prefill_p50_ms, sp.prefill.p99_ms AS prefill_p99_ms
FROM rows r
LEFT JOIN itl i ON i.point = r.point AND r.class_name = '(all)'
LEFT JOIN span_stats sp ON sp.point = r.point AND r.class_name = '(all)';
