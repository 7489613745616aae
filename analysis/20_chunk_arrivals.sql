-- chunk_arrivals: one row per content chunk of every request (the raw material of ITL and of
-- throughput over a window).
--   chunk_index   = 1..n_chunks in arrival order.
--   arrival_unix  = sent_unix + chunk_offsets_ms[i] / 1000.
--   tokens        = k_i = chunk_tokens[i] (1 when NULL or < 1).
--   usage_tokens  = k_i * output_tokens / sum(k): the chunk's share of the server's usage count,
--                   so that summed over a request it equals output_tokens (= k_i when the chunk
--                   counts agree with usage, or when output_tokens is NULL).
--   gap_ms        = chunk_offsets_ms[i] - chunk_offsets_ms[i-1]; NULL for the first chunk.
CREATE OR REPLACE VIEW chunk_arrivals AS
SELECT
    run_id,
    request_id,
    class_name,
    stage,
    level,
    measured,
    ok,
    sent_unix,
    unnest(range(1, n_chunks + 1)) AS chunk_index,
    sent_unix + unnest(chunk_offsets_ms) / 1000.0 AS arrival_unix,
    unnest(chunk_weights) AS tokens,
    unnest(chunk_weights) * coalesce(output_tokens, chunk_tokens_total) / chunk_tokens_total
        AS usage_tokens,
    unnest(list_prepend(NULL::DOUBLE, gaps_ms)) AS gap_ms
FROM request_metrics
WHERE n_chunks > 0;
