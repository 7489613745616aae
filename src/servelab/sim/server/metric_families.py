"""The metric families ``/metrics`` exposes from plain per-engine numbers, as tables: each
family's Prometheus type, name and help text (vLLM's ``loggers.py`` words for vLLM's) and the
attribute of the per-engine stats its sample is read from. ``metrics.SimCollector`` turns them
into families at scrape time."""
from __future__ import annotations

# Each engine's state, in vLLM's order: (type, name, help, EngineStats attribute).
ENGINE_FAMILIES = (
    ("gauge", "vllm:num_requests_running", "Number of requests in model execution batches.",
     "num_running"),
    ("gauge", "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
     "num_waiting"),
    ("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
     "kv_usage"),
    ("counter", "vllm:prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries_total"),
    ("counter", "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits_total"),
    ("counter", "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
     "num_preemptions_total"),
)
# Speculative decoding, per engine: (type, name, help, EngineStats attribute).
SPEC_DECODE_COUNTERS = (
    ("counter", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
     "spec_num_drafts_total"),
    ("counter", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
     "spec_num_draft_tokens_total"),
    ("counter", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
     "spec_num_accepted_tokens_total"),
)
# The simulator's own health, per engine's frontend: (type, name, help, attribute).
SIM_FAMILIES = (
    ("gauge", "servelab:sim_lag_seconds",
     "How late the last step's tokens were delivered against the engine's schedule.", "lag_last"),
    ("gauge", "servelab:sim_lag_max_seconds", "Largest step lag since start.", "lag_max"),
    ("histogram", "servelab:sim_step_lag_seconds",
     "Per step: delivery time minus scheduled step end.", "lag"),
    ("histogram", "servelab:sim_delivery_seconds",
     "Per step: time spent writing the step's chunks to the clients.", "delivery"),
    ("counter", "servelab:sim_steps", "Engine steps run in real time.", "steps"),
    ("counter", "servelab:sim_lag_resyncs",
     "Times the step schedule was re-anchored because lag passed the resync threshold.",
     "resyncs"),
)
# The frontend's histograms, in vLLM's order: (name, help, EngineMetrics attribute).
FRONTEND_HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens_hist"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.",
     "generation_tokens_hist"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     "iteration_tokens"),
    ("vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", "max_num_generation_tokens"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "params_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
     "params_max_tokens"),
    ("vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
     "prefill_kv_computed"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", "tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     "queue"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     "inference"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     "decode"),
)
