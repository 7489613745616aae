-- itl_chunks: the CHUNK view of inter-token latency, one row per gap between consecutive content
-- chunks of a request (chunk_index >= 2; the same rows as chunk_arrivals with chunk_index >= 2):
--   gap_ms        = chunk_offsets_ms[i] - chunk_offsets_ms[i-1]
--   tokens        = k_i, the tokens carried by the later chunk
--   itl_ms        = gap_ms / tokens (the per-token gap that itl_tokens repeats k_i times)
-- This is what `vllm bench serve` pools. With speculative decoding one chunk carries several
-- tokens, so a chunk gap is roughly (acceptance length) x the per-token pace: use it to see the
-- stream's burstiness, not its pace.
CREATE OR REPLACE VIEW itl_chunks AS
-- chunk_arrivals' own rows and columns (no second unnest), gap_ms and tokens moved last
SELECT * EXCLUDE (sent_unix, usage_tokens, tokens, gap_ms), gap_ms, tokens, gap_ms / tokens AS itl_ms
FROM chunk_arrivals
WHERE chunk_index >= 2;
