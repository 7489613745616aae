#!/bin/bash
# Issue 21 on a real H200: where TTFT goes under load, BF16 and FP8 side by side.
# Needs (the lead starts them first): vLLM 0.26 on 127.0.0.1:8000 (BF16) and 127.0.0.1:8001 (FP8),
# each started with
#     OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=500 \
#     vllm serve ... --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces
# Both send to 4318: `servelab run --otlp-port 4318` listens there during each run (runs are one
# at a time, so the idle server sends nothing; a late span of the previous run is counted in
# span_join as one with no request). Python 3.12 with servelab's deps, PYTHONPATH=/tmp/sl:src
# (opentelemetry-proto and protobuf: pip install --no-deps .device/w4/*.whl into /tmp/sl).
# Run from the checkout's root; the database and the printed tables go to ${OUT:-/tmp/out}.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; DB=$O/phases.duckdb
SL() { env PYTHONPATH=${PYTHONPATH:-/tmp/sl:src} PYTHONUNBUFFERED=1 python3 -m servelab.cli "$@"; }
for v in bf16:8000 fp8:8001; do
  name=${v%%:*}; port=${v##*:}
  SL run --profile traffic_profiles/h200_phases.yaml --target http://127.0.0.1:$port \
    --variant "$name" --db "$DB" --run-id "phases_$name" --otlp-port 4318 --quiet \
    --tag gpu=h200 > "$O/run_$name.log" 2>&1
  echo "run $name: exit $?"; grep -E "server phases|clock offset|not joined" "$O/run_$name.log"
done
SL sql --db "$DB" --format csv "
SELECT run_id, level, requests, with_span, without_span, duplicate_spans,
  round(ttft_p50_ms, 1) AS ttft_p50,
  round(to_server_p50_ms, 2) AS to_server_p50, round(to_server_p99_ms, 2) AS to_server_p99,
  round(queue_p50_ms, 1) AS queue_p50, round(queue_p99_ms, 1) AS queue_p99,
  round(prefill_p50_ms, 1) AS prefill_p50, round(prefill_p99_ms, 1) AS prefill_p99,
  round(server_other_p50_ms, 1) AS other_p50, round(server_other_p99_ms, 1) AS other_p99,
  round(to_client_p50_ms, 2) AS to_client_p50, round(to_client_p99_ms, 2) AS to_client_p99,
  round(ttft_residual_p50_ms, 1) AS ttft_resid_p50, round(ttft_residual_p99_ms, 1) AS ttft_resid_p99,
  round(decode_p50_ms, 1) AS decode_p50, round(last_to_client_p50_ms, 2) AS last_p50,
  round(e2e_residual_p50_ms, 1) AS e2e_resid_p50, round(e2e_residual_p99_ms, 1) AS e2e_resid_p99,
  round(clock_offset_ms, 3) AS clock_ms, clock_offset_source
FROM phase_stage_summary ORDER BY run_id, level" | tee "$O/phases.csv"
SL sql --db "$DB" "SELECT * FROM span_join ORDER BY run_id" | tee "$O/span_join.txt"
SL sql --db "$DB" "SELECT run_id, fwd_min_ms, bwd_min_ms, clock_offset_ms, clock_offset_source FROM span_clock" \
  | tee "$O/span_clock.txt"
