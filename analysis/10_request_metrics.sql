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
--   chunk weight  k_i = chunk_tokens[i], taken as 1 when NULL or < 1 (a content chunk carries text);
--                 chunk_token_source says whether the counts came from per-chunk usage or are the
--                 recorder's 1-per-chunk estimate.
--   n_chunks      = number of content chunks; tokens_per_chunk = sum(k_i) / n_chunks.
--   itl_chunk_mean_ms = mean of the chunk gaps g_i = offset_i - offset_{i-1} (i >= 2).
--   itl_mean_ms   = sum(g_i) / sum(k_i, i >= 2): the per-request mean of the per-token view
--                   (equals the mean of g_i/k_i counted k_i times); NULL with fewer than 2 chunks.
--   itl_max_ms    = max over i >= 2 of g_i / k_i (the worst per-token gap).
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
CREATE OR REPLACE VIEW request_metrics AS
WITH base AS (
    SELECT
        q.*,
        coalesce(len(q.chunk_offsets_ms), 0) AS n_chunks,
        CASE WHEN len(q.chunk_tokens) = len(q.chunk_offsets_ms)
             THEN list_transform(q.chunk_tokens, lambda k: greatest(coalesce(k, 1), 1))
             ELSE list_transform(range(1, coalesce(len(q.chunk_offsets_ms), 0) + 1),
                                 lambda i: greatest(coalesce(q.chunk_tokens[i], 1), 1))
        END AS chunk_weights,
        list_transform(list_zip(list_slice(q.chunk_offsets_ms, 2, -1), list_slice(q.chunk_offsets_ms, 1, -2)),
                       lambda pair: pair[1] - pair[2]) AS gaps_ms
    FROM requests q
),
derived AS (
    SELECT
        b.*,
        b.error_kind IS NULL AS ok,
        coalesce(b.ttft_ms, 1000.0 * (b.first_token_unix - b.sent_unix)) AS ttft_ms_eff,
        coalesce(b.e2e_ms, 1000.0 * (b.last_token_unix - b.sent_unix)) AS e2e_ms_eff,
        list_sum(b.chunk_weights) AS chunk_tokens_total,
        list_sum(list_slice(b.chunk_weights, 2, -1)) AS gap_tokens_total,
        CASE WHEN list_max(b.chunk_weights) = 1 THEN list_max(b.gaps_ms)
             ELSE list_max(list_transform(list_zip(b.gaps_ms, list_slice(b.chunk_weights, 2, -1)),
                                          lambda pair: pair[1] / pair[2]))
        END AS itl_max_ms
    FROM base b
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
    CASE WHEN d.output_tokens > 1
         THEN (d.e2e_ms_eff - d.ttft_ms_eff) / (d.output_tokens - 1) END AS tpot_ms,
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
    d.n_chunks,
    d.chunk_tokens_total,
    d.chunk_tokens_total / nullif(d.n_chunks, 0) AS tokens_per_chunk,
    list_avg(d.gaps_ms) AS itl_chunk_mean_ms,
    list_sum(d.gaps_ms) / nullif(d.gap_tokens_total, 0) AS itl_mean_ms,
    d.itl_max_ms,
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
         ELSE d.ok AND (d.itl_max_ms IS NULL OR d.itl_max_ms <= c.slo_itl_ms) END AS itl_slo_met,
    CASE WHEN c.slo_e2e_ms IS NULL THEN NULL
         ELSE d.ok AND coalesce(d.e2e_ms_eff <= c.slo_e2e_ms, false) END AS e2e_slo_met,
    d.ok
        AND (c.slo_ttft_ms IS NULL OR coalesce(d.ttft_ms_eff <= c.slo_ttft_ms, false))
        AND (c.slo_tpot_ms IS NULL OR NOT coalesce(d.output_tokens > 1, false)
             OR coalesce((d.e2e_ms_eff - d.ttft_ms_eff) / (d.output_tokens - 1) <= c.slo_tpot_ms, false))
        AND (c.slo_itl_ms IS NULL OR d.itl_max_ms IS NULL OR d.itl_max_ms <= c.slo_itl_ms)
        AND (c.slo_e2e_ms IS NULL OR coalesce(d.e2e_ms_eff <= c.slo_e2e_ms, false)) AS slo_met,
    d.prefix_group,
    d.session_id,
    d.turn,
    d.response_id,
    d.chunk_offsets_ms,
    d.chunk_weights,
    d.gaps_ms
FROM derived d
LEFT JOIN stages s ON s.run_id = d.run_id AND s.stage = d.stage
LEFT JOIN run_classes c ON c.run_id = d.run_id AND c.class_name = d.class_name;
