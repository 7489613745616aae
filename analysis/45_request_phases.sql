-- request_phases: where each request's TTFT and E2E went, from the client's row (requests) and
-- the server's own span (server_spans, OTLP llm_request, joined on the id servelab sent).
--   span      = the request's first span by received_unix (server_spans.request_id =
--               requests.request_id); spans = how many matched; duplicate_spans = spans - 1.
--               Every sent request has a row; one without a span has has_span false and NULL
--               phases (never a guess), and is counted in span_join and phase_stage_summary.
--   theta = the run's clock offset, span_clock.clock_offset_ms (44_span_clock.sql): every row
--               carries clock_offset_ms, _lo_ms, _hi_ms and _source.
--   to_server_ms     = 1000*(span start - sent_unix) - theta: network, API server parsing, chat
--                      template and tokenization (vLLM stamps arrival once its engine client has
--                      the request).
--   queue_ms         = 1000*time_in_queue_s        (engine: queued -> first scheduled).
--   prefill_ms       = 1000*time_in_model_prefill_s (engine: first scheduled -> first token).
--   server_ttft_ms   = 1000*time_to_first_token_s  (API server: arrival -> first output).
--   server_other_ms  = server_ttft_ms - queue_ms - prefill_ms (API server -> engine hand-off and
--                      the first token's way back to the API server).
--   to_client_ms     = 1000*(first_token_unix - (span start + time_to_first_token_s)) + theta:
--                      detokenize, SSE framing, network, the client's read.
--   ttft_residual_ms = ttft_ms - (to_server_ms + queue_ms + prefill_ms + to_client_ms): what
--                      the measured phases leave of the client's TTFT (server_other_ms, plus
--                      the client's clock anchor error).
--   decode_ms        = 1000*time_in_model_decode_s (engine: first -> last token).
--   server_e2e_ms    = 1000*e2e_s.
--   last_to_client_ms = 1000*(last_token_unix - server last output) + theta.
--   e2e_residual_ms  = e2e_ms - (to_server_ms + queue_ms + prefill_ms + decode_ms +
--                      last_to_client_ms).
-- span_join: per run, spans received, matched to a request, with no request (not this run's
--   id, or an id no request row has), duplicates (spans beyond the first per server id), and
--   sent requests with no span.
-- phase_stage_summary: per run x stage, over measured completed requests: counts (requests,
--   with_span, without_span, duplicate_spans) and the median (_p50) and p99 (quantile_cont,
--   servelab_p50_p99 of 30_stage_summary.sql) of every phase and residual, with the run's clock
--   offset.
CREATE OR REPLACE VIEW request_phases AS
WITH matched AS (
    SELECT *,
        count(*) OVER (PARTITION BY run_id, request_id) AS spans,
        row_number() OVER (PARTITION BY run_id, request_id ORDER BY received_unix, start_unix)
            AS nth
    FROM server_spans
    WHERE request_id IS NOT NULL
),
joined AS (
    SELECT m.run_id, m.request_id, m.class_name, m.stage, m.level, m.measured, m.ok,
        m.sent_unix, m.first_token_unix, m.last_token_unix, m.ttft_ms, m.e2e_ms,
        m.output_tokens,
        s.request_id IS NOT NULL AS has_span,
        coalesce(s.spans, 0) AS spans,
        greatest(coalesce(s.spans, 0) - 1, 0) AS duplicate_spans,
        s.server_request_id, s.start_unix AS span_start_unix,
        coalesce(s.start_unix + s.e2e_s, s.end_unix) AS server_last_unix,
        s.time_to_first_token_s, s.completion_tokens AS server_completion_tokens,
        1000 * s.time_in_queue_s AS queue_ms,
        1000 * s.time_in_model_prefill_s AS prefill_ms,
        1000 * s.time_to_first_token_s AS server_ttft_ms,
        1000 * s.time_in_model_decode_s AS decode_ms,
        1000 * s.e2e_s AS server_e2e_ms,
        c.clock_offset_ms, c.clock_offset_lo_ms, c.clock_offset_hi_ms, c.clock_offset_source
    FROM request_metrics m
    LEFT JOIN matched s ON s.run_id = m.run_id AND s.request_id = m.request_id AND s.nth = 1
    LEFT JOIN span_clock c ON c.run_id = m.run_id
    WHERE m.sent_unix IS NOT NULL AND NOT m.dropped
),
phased AS (
    SELECT *,
        1000 * (span_start_unix - sent_unix) - clock_offset_ms AS to_server_ms,
        server_ttft_ms - queue_ms - prefill_ms AS server_other_ms,
        1000 * (first_token_unix - (span_start_unix + time_to_first_token_s)) + clock_offset_ms
            AS to_client_ms,
        1000 * (last_token_unix - server_last_unix) + clock_offset_ms AS last_to_client_ms
    FROM joined
)
SELECT * EXCLUDE (time_to_first_token_s, server_last_unix),
    ttft_ms - (to_server_ms + queue_ms + prefill_ms + to_client_ms) AS ttft_residual_ms,
    e2e_ms - (to_server_ms + queue_ms + prefill_ms + decode_ms + last_to_client_ms)
        AS e2e_residual_ms
FROM phased;

CREATE OR REPLACE VIEW span_join AS
WITH per_id AS (
    SELECT run_id, server_request_id, request_id, count(*) AS n
    FROM server_spans GROUP BY ALL
),
spans AS (
    SELECT p.run_id, sum(p.n)::BIGINT AS spans, sum(p.n - 1)::BIGINT AS duplicate_spans,
        count(r.request_id) AS spans_matched,
        sum(CASE WHEN r.request_id IS NULL THEN p.n ELSE 0 END)::BIGINT AS spans_without_request
    FROM per_id p
    LEFT JOIN requests r ON r.run_id = p.run_id AND r.request_id = p.request_id
    GROUP BY p.run_id
),
reqs AS (
    SELECT run_id, count(*) AS requests_sent,
        count(*) FILTER (WHERE NOT has_span) AS requests_without_span,
        count(*) FILTER (WHERE NOT has_span AND ok) AS completed_without_span
    FROM request_phases GROUP BY run_id
)
SELECT coalesce(q.run_id, s.run_id) AS run_id,
    coalesce(q.requests_sent, 0) AS requests_sent,
    coalesce(s.spans, 0) AS spans,
    coalesce(s.spans_matched, 0) AS spans_matched,
    coalesce(s.spans_without_request, 0) AS spans_without_request,
    coalesce(s.duplicate_spans, 0) AS duplicate_spans,
    coalesce(q.requests_without_span, 0) AS requests_without_span,
    coalesce(q.completed_without_span, 0) AS completed_without_span
FROM reqs q FULL OUTER JOIN spans s ON s.run_id = q.run_id;

CREATE OR REPLACE VIEW phase_stage_summary AS
WITH per_stage AS (
    SELECT run_id, stage, any_value(level) AS level,
        count(*) AS requests,
        count(*) FILTER (WHERE has_span) AS with_span,
        count(*) FILTER (WHERE NOT has_span) AS without_span,
        sum(duplicate_spans)::BIGINT AS duplicate_spans,
        any_value(clock_offset_ms) AS clock_offset_ms,
        any_value(clock_offset_lo_ms) AS clock_offset_lo_ms,
        any_value(clock_offset_hi_ms) AS clock_offset_hi_ms,
        any_value(clock_offset_source) AS clock_offset_source,
        quantile_cont(ttft_ms, 0.5) FILTER (WHERE has_span) AS ttft_p50_ms,
        servelab_p50_p99(to_server_ms) AS to_server,
        servelab_p50_p99(queue_ms) AS queue,
        servelab_p50_p99(prefill_ms) AS prefill,
        servelab_p50_p99(server_other_ms) AS server_other,
        servelab_p50_p99(to_client_ms) AS to_client,
        servelab_p50_p99(ttft_residual_ms) AS ttft_residual,
        quantile_cont(server_ttft_ms, 0.5) AS server_ttft_p50_ms,
        quantile_cont(e2e_ms, 0.5) FILTER (WHERE has_span) AS e2e_p50_ms,
        servelab_p50_p99(decode_ms) AS decode,
        servelab_p50_p99(last_to_client_ms) AS last_to_client,
        servelab_p50_p99(e2e_residual_ms) AS e2e_residual
    FROM request_phases
    WHERE measured AND ok
    GROUP BY run_id, stage
)
-- Each phase's struct spread into <phase>_p50_ms, <phase>_p99_ms, in the order above.
SELECT run_id, stage, level, requests, with_span, without_span, duplicate_spans,
    clock_offset_ms, clock_offset_lo_ms, clock_offset_hi_ms, clock_offset_source, ttft_p50_ms,
    COLUMNS(to_server.*) AS 'to_server_\0',
    COLUMNS(queue.*) AS 'queue_\0',
    COLUMNS(prefill.*) AS 'prefill_\0',
    COLUMNS(server_other.*) AS 'server_other_\0',
    COLUMNS(to_client.*) AS 'to_client_\0',
    COLUMNS(ttft_residual.*) AS 'ttft_residual_\0',
    server_ttft_p50_ms,
    e2e_p50_ms,
    COLUMNS(decode.*) AS 'decode_\0',
    COLUMNS(last_to_client.*) AS 'last_to_client_\0',
    COLUMNS(e2e_residual.*) AS 'e2e_residual_\0'
FROM per_stage;
