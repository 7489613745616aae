-- server_phase_means: the server's own per-request phase times from its /metrics histograms, one
-- row per run x stage x phase, over the stage's measured window [measure_start_unix,
-- measure_end_unix). Per histogram series (one per engine or scheduler): the increase of _sum and
-- of _count between the first and the last scrape inside the window (a decrease is a restarted
-- server: the last value counts); summed over the series.
--   requests = increase(_count): requests that completed the phase in the window;
--   mean_ms  = 1000 * increase(_sum) / increase(_count); NULL with fewer than two scrapes.
--   Means only: a histogram's buckets give percentiles only to a bucket's width (the OTLP spans
--   of request_phases give exact ones where the server sends them). The phases of one window are
--   not the same requests: vLLM observes queue/prefill/decode/e2e when a request finishes and
--   TTFT at its first token (SGLang: queue and prefill when the phase ends), so in a short window
--   queue + prefill need not stay under TTFT.
-- Phases, and what each server calls them (their own definitions):
--   queue    vllm:request_queue_time_seconds (queued -> first scheduled);
--            sglang:queue_time_seconds (waiting queue -> first forward)
--   prefill  vllm:request_prefill_time_seconds (first scheduled -> first token);
--            sglang:per_stage_req_latency_seconds{stage="prefill_forward"} (first forward ->
--            prefill done, every chunk)
--   decode   vllm:request_decode_time_seconds (first token -> last token)
--   ttft     vllm:time_to_first_token_seconds, sglang:time_to_first_token_seconds (API server /
--            tokenizer manager: arrival -> first output)
--   e2e      vllm:e2e_request_latency_seconds, sglang:e2e_request_latency_seconds
--   intake   sglang:per_stage_req_latency_seconds{stage="request_process"} (scheduler received
--            -> waiting queue; SGLang only)
-- A scraped name with ':' written as '_' (vllm_x) reads as vllm:x.
CREATE OR REPLACE VIEW server_phase_means AS
WITH
phases(histogram, stage_label, phase) AS (
    VALUES
        ('vllm:request_queue_time_seconds', NULL, 'queue'),
        ('vllm:request_prefill_time_seconds', NULL, 'prefill'),
        ('vllm:request_decode_time_seconds', NULL, 'decode'),
        ('vllm:time_to_first_token_seconds', NULL, 'ttft'),
        ('vllm:e2e_request_latency_seconds', NULL, 'e2e'),
        ('sglang:queue_time_seconds', NULL, 'queue'),
        ('sglang:per_stage_req_latency_seconds', 'prefill_forward', 'prefill'),
        ('sglang:time_to_first_token_seconds', NULL, 'ttft'),
        ('sglang:e2e_request_latency_seconds', NULL, 'e2e'),
        ('sglang:per_stage_req_latency_seconds', 'request_process', 'intake')
),
samples AS (
    SELECT m.run_id, m.t_unix, m.value, CAST(m.labels AS VARCHAR) AS series,
           m.labels['stage'] AS stage_label,
           regexp_replace(regexp_replace(m.name, '^(vllm|sglang)_', '\1:'),
                          '_(sum|count)$', '') AS histogram,
           regexp_extract(m.name, '_(sum|count)$', 1) AS part
    FROM server_metrics m
    WHERE (m.name LIKE 'vllm%' OR m.name LIKE 'sglang%')
      AND (m.name LIKE '%\_sum' ESCAPE '\' OR m.name LIKE '%\_count' ESCAPE '\')
      AND m.value IS NOT NULL
),
in_window AS (
    SELECT s.run_id, s.stage, s.level, p.phase, p.histogram, x.series, x.part,
           arg_min(x.value, x.t_unix) AS first_value, arg_max(x.value, x.t_unix) AS last_value,
           count(*) AS scrapes
    FROM stages s
    JOIN samples x
      ON x.run_id = s.run_id AND x.t_unix >= s.measure_start_unix AND x.t_unix < s.measure_end_unix
    JOIN phases p
      ON p.histogram = x.histogram AND p.stage_label IS NOT DISTINCT FROM x.stage_label
    GROUP BY s.run_id, s.stage, s.level, p.phase, p.histogram, x.series, x.part
),
increases AS (
    SELECT run_id, stage, level, phase, histogram, part, min(scrapes) AS scrapes,
           sum(CASE WHEN last_value >= first_value THEN last_value - first_value
                    ELSE last_value END) AS increase
    FROM in_window
    GROUP BY run_id, stage, level, phase, histogram, part
)
SELECT run_id, stage, level, phase, histogram,
       CAST(max(increase) FILTER (WHERE part = 'count') AS BIGINT) AS requests,
       CASE WHEN min(scrapes) >= 2 THEN 1000 * max(increase) FILTER (WHERE part = 'sum')
            / nullif(max(increase) FILTER (WHERE part = 'count'), 0) END AS mean_ms
FROM increases
GROUP BY run_id, stage, level, phase, histogram;
