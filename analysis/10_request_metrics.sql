-- request_metrics: one row per request with every per-request metric, defined once.
--   ok            = error_kind IS NULL (the request completed).
--   measured      = NOT warmup (a NULL warmup counts as false) AND sent_unix (scheduled_unix for a
--                   dropped arrival) lies in its stage's measured window
--                   [measure_start_unix, measure_end_unix).
--   dropped       = arrival_status = 'dropped' (open loop: never sent; never counted as a request).
--   ttft_ms       = recorded ttft_ms (monotonic clock); else 1000*(first_token_unix - sent_unix).
--   e2e_ms        = recorded e2e_ms; else 1000*(last_token_unix - sent_unix).
--   tpot_ms       = (e2e_ms - ttft_ms) / (output_tokens - 1) when output_tokens > 1, else NULL.
--   send_lag_ms   = 1000*(sent_unix - scheduled_unix)           (open loop; NULL closed loop).
--   ttft_sched_ms = 1000*(first_token_unix - scheduled_unix)    (coordinated-omission aware).
--   e2e_sched_ms  = 1000*(last_token_unix - scheduled_unix).
--   chunk weight  k_i = servelab_chunk_weight(chunk_tokens[i]): 1 when NULL or < 1 (a content chunk
--                 carries text; the macro is the store's, src/servelab/store/schema.sql, which
--                 derives the chunk scalars with it);
--                 chunk_token_source says whether the counts came from per-chunk usage or are the
--                 recorder's 1-per-chunk estimate. g_i = offset_i - offset_{i-1} (i >= 2):
--                 servelab_chunk_gaps(chunk_offsets_ms), the store's macro too.
--   n_chunks      = number of content chunks; tokens_per_chunk = sum(k_i) / n_chunks.
--   itl_chunk_mean_ms = mean of the chunk gaps g_i.
--   itl_mean_ms   = sum(g_i) / sum(k_i, i >= 2): the per-request mean of the per-token view
--                   (equals the mean of g_i/k_i counted k_i times); NULL with fewer than 2 chunks.
--   itl_max_ms    = max over i >= 2 of g_i / k_i (the worst per-token gap).
--   first_chunk_unix, last_chunk_unix = sent_unix + offset_1 / 1000, sent_unix + offset_n / 1000.
--   These sums and extremes are read from the request's chunk scalars (requests.chunk_count ..
--   last_chunk_ms, computed from the same lists when the row was written: store.db.REQUEST_SCALARS),
--   so a query over them reads no chunk list; chunk_weights (k_i) and gaps_ms (g_i) are the lists
--   themselves, for drill-down (chunk_arrivals).
-- SLOs come from run_classes of the request's class; a column is NULL when the class sets none:
--   ttft_slo_met  = ok AND ttft_ms <= slo_ttft_ms.
--   tpot_slo_met  = ok AND (tpot_ms IS NULL OR tpot_ms <= slo_tpot_ms)  (one output token: met).
--   itl_slo_met   = ok AND (itl_max_ms IS NULL OR itl_max_ms <= slo_itl_ms).
--       The ITL SLO is on the WORST PER-TOKEN gap: TPOT already bounds the mean decode pace, so
--       the ITL SLO is there to catch the stall a reader sees (a preemption, a long prefill in the
--       batch); per token (g_i/k_i) so that speculative decoding, which delivers k tokens after one
--       gap, is judged by the pace of its text like any other variant.
--   e2e_slo_met   = ok AND e2e_ms <= slo_e2e_ms.
--   slo_met       = ok AND every SLO that the class sets is met.  A failed request meets no SLO.

-- tpot_ms and slo_met, as macros (request_metrics' columns; the master's live window reads them
-- through request_metrics too: servelab_live_figures in 30_stage_summary.sql).
CREATE OR REPLACE MACRO servelab_tpot_ms(e2e_ms, ttft_ms, output_tokens) AS
    CASE WHEN output_tokens > 1 THEN (e2e_ms - ttft_ms) / (output_tokens - 1) END;
CREATE OR REPLACE MACRO servelab_slo_met(ok, ttft_ms, e2e_ms, output_tokens, itl_max_ms,
                                         slo_ttft_ms, slo_tpot_ms, slo_itl_ms, slo_e2e_ms) AS
    ok
    AND (slo_ttft_ms IS NULL OR coalesce(ttft_ms <= slo_ttft_ms, false))
    AND (slo_tpot_ms IS NULL OR NOT coalesce(output_tokens > 1, false)
         OR coalesce(servelab_tpot_ms(e2e_ms, ttft_ms, output_tokens) <= slo_tpot_ms, false))
    AND (slo_itl_ms IS NULL OR itl_max_ms IS NULL OR itl_max_ms <= slo_itl_ms)
    AND (slo_e2e_ms IS NULL OR coalesce(e2e_ms <= slo_e2e_ms, false));

CREATE OR REPLACE VIEW request_metrics AS
WITH derived AS (
    SELECT
        q.*,
        q.error_kind IS NULL AS ok,
        coalesce(q.ttft_ms, 1000.0 * (q.first_token_unix - q.sent_unix)) AS ttft_ms_eff,
        coalesce(q.e2e_ms, 1000.0 * (q.last_token_unix - q.sent_unix)) AS e2e_ms_eff,
        q.rowid AS request_rowid
    FROM requests q
)
SELECT
    d.run_id,
    d.request_id,
    d.worker,
    d.worker_seq,
    d.class_name,
    d.stage,
    d.level,
    d.warmup,
    d.ok,
    d.error_kind,
    d.http_status,
    d.finish_reason,
    d.arrival_status,
    coalesce(d.arrival_status = 'dropped', false) AS dropped,
    coalesce(NOT coalesce(d.warmup, false)
             AND coalesce(d.sent_unix, d.scheduled_unix) >= s.measure_start_unix
             AND coalesce(d.sent_unix, d.scheduled_unix) < s.measure_end_unix, false) AS measured,
    d.scheduled_unix,
    d.sent_unix,
    d.first_token_unix,
    d.last_token_unix,
    d.done_unix,
    d.ttft_ms_eff AS ttft_ms,
    d.e2e_ms_eff AS e2e_ms,
    servelab_tpot_ms(d.e2e_ms_eff, d.ttft_ms_eff, d.output_tokens) AS tpot_ms,
    1000.0 * (d.sent_unix - d.scheduled_unix) AS send_lag_ms,
    1000.0 * (d.first_token_unix - d.scheduled_unix) AS ttft_sched_ms,
    1000.0 * (d.last_token_unix - d.scheduled_unix) AS e2e_sched_ms,
    d.prompt_tokens_target,
    d.prompt_tokens,
    d.output_tokens_target,
    d.output_tokens,
    d.token_source,
    d.chunk_token_source,
    d.cached_tokens,
    d.chunk_count AS n_chunks,
    d.chunk_token_sum AS chunk_tokens_total,
    d.chunk_token_sum / nullif(d.chunk_count, 0) AS tokens_per_chunk,
    d.gap_mean_ms AS itl_chunk_mean_ms,
    d.gap_sum_ms / nullif(d.gap_token_sum, 0) AS itl_mean_ms,
    d.gap_token_max_ms AS itl_max_ms,
    c.slo_ttft_ms,
    c.slo_tpot_ms,
    c.slo_itl_ms,
    c.slo_e2e_ms,
    CASE WHEN c.slo_ttft_ms IS NULL THEN NULL
         ELSE d.ok AND coalesce(d.ttft_ms_eff <= c.slo_ttft_ms, false) END AS ttft_slo_met,
    CASE WHEN c.slo_tpot_ms IS NULL THEN NULL
         ELSE d.ok AND coalesce((d.e2e_ms_eff - d.ttft_ms_eff) / (d.output_tokens - 1) <= c.slo_tpot_ms
                                OR NOT coalesce(d.output_tokens > 1, false), false) END AS tpot_slo_met,
    CASE WHEN c.slo_itl_ms IS NULL THEN NULL
         ELSE d.ok AND (d.gap_token_max_ms IS NULL OR d.gap_token_max_ms <= c.slo_itl_ms) END AS itl_slo_met,
    CASE WHEN c.slo_e2e_ms IS NULL THEN NULL
         ELSE d.ok AND coalesce(d.e2e_ms_eff <= c.slo_e2e_ms, false) END AS e2e_slo_met,
    servelab_slo_met(d.ok, d.ttft_ms_eff, d.e2e_ms_eff, d.output_tokens, d.gap_token_max_ms,
                     c.slo_ttft_ms, c.slo_tpot_ms, c.slo_itl_ms, c.slo_e2e_ms) AS slo_met,
    d.prefix_group,
    d.session_id,
    d.turn,
    d.response_id,
    d.sent_unix + d.first_chunk_ms / 1000.0 AS first_chunk_unix,
    d.sent_unix + d.last_chunk_ms / 1000.0 AS last_chunk_unix,
    d.chunk_offsets_ms,
    CASE WHEN len(d.chunk_tokens) = len(d.chunk_offsets_ms)
         THEN list_transform(d.chunk_tokens, lambda k: servelab_chunk_weight(k))
         ELSE list_transform(range(1, d.chunk_count + 1), lambda i: servelab_chunk_weight(d.chunk_tokens[i]))
    END AS chunk_weights,
    servelab_chunk_gaps(d.chunk_offsets_ms) AS gaps_ms,
    d.request_rowid
FROM derived d
LEFT JOIN stages s ON s.run_id = d.run_id AND s.stage = d.stage
LEFT JOIN run_classes c ON c.run_id = d.run_id AND c.class_name = d.class_name;
