-- itl_tokens: the TOKEN view of inter-token latency, the one servelab reports as "ITL":
-- each chunk gap g_i spread evenly over the k_i tokens of the later chunk, one row per token:
--   itl_ms = g_i / k_i, repeated k_i times (k_i rows); gap_ms = g_i and tokens = k_i ride along,
--   and chunk_first is true on exactly one of the k_i rows, so the chunk view can be read back
--   from this view (WHERE chunk_first) without a second pass.
-- Why this one: it measures the pace at which text arrives, so a speculative-decoding variant
-- (k tokens after one gap) and a plain one (1 token per gap) are compared on the same scale;
-- with one token per chunk it is identical to itl_chunks. Its mean over a request is
-- request_metrics.itl_mean_ms = sum(g_i) / sum(k_i).
CREATE OR REPLACE VIEW itl_tokens AS
SELECT
    * EXCLUDE (itl_ms),
    unnest(list_resize([itl_ms], tokens, itl_ms)) AS itl_ms,
    unnest(list_resize([true], tokens, false)) AS chunk_first
FROM itl_chunks;
