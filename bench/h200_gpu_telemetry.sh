#!/bin/bash
# Issue 21 on a real H200: GPU telemetry (NVML) beside servelab load, J/token for BF16 and FP8,
# and the raw NVML samples to vendor as the CI fixture (tests/orchestration/data/nvml_h200/).
#
# Needs (the lead starts them first, as for bench/h200_phases.sh): vLLM 0.26 on 127.0.0.1:8000
# (BF16) and 127.0.0.1:8001 (FP8), ideally with --enable-logging-iteration-details and their
# logs in LOG_BF16 / LOG_FP8 (then server_iterations fills too), Python 3.12 with servelab's
# deps under PYTHONPATH=/tmp/sl:src, and nvidia-ml-py carried in .device/w4 (this script unpacks
# it into /tmp/sl: a pure-Python wheel). Run from the checkout's root. Both servers share the one
# GPU: each run's figures are the whole board's, the idle server's share included (memory held,
# no compute); say so beside the figures.
#   REUSE_DB=/tmp/out/phases.duckdb  skips the runs and reports from a database whose runs were
#   made with NVML on (bench/h200_phases.sh's runs are, once nvidia-ml-py is importable: a
#   loopback --target samples NVML by default).
# Device time: ~200 s of runs (2 x 4 levels x 20 s + ramps) and a few seconds more.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
SL_PATH=${PYTHONPATH:-/tmp/sl:src}
PY() { env PYTHONPATH="$SL_PATH" PYTHONUNBUFFERED=1 python3 "$@"; }
SL() { PY -m servelab.cli "$@"; }
if ! PY -c "import pynvml" 2>/dev/null; then
  python3 -m zipfile -e .device/w4/nvidia_ml_py-13.615.71-py3-none-any.whl /tmp/sl || exit 1
fi
PY -c "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0);
print('NVML', pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlDeviceGetName(h),
      'energy mJ', pynvml.nvmlDeviceGetTotalEnergyConsumption(h))" | tee "$O/nvml_probe.txt"
nvidia-smi -q -d POWER,CLOCK,TEMPERATURE > "$O/nvidia_smi_q.txt" 2>&1

# The raw fixture: the standalone sampler, every 0.25 s, across idle, both runs and idle again.
PY -m servelab.orchestration.gpu_telemetry --out "$O/nvml_samples.jsonl" --interval 0.25 \
  > "$O/sampler.log" 2>&1 &
SAMPLER=$!
sleep 5   # idle baseline

DB=${REUSE_DB:-$O/energy.duckdb}
if [ -z "${REUSE_DB:-}" ]; then
  for v in bf16:8000:${LOG_BF16:-} fp8:8001:${LOG_FP8:-}; do
    IFS=: read -r name port log <<< "$v"
    logflag=(); [ -n "$log" ] && logflag=(--log "$log")
    SL run --profile traffic_profiles/h200_phases.yaml --target "http://127.0.0.1:$port" \
      --variant "$name" --db "$DB" --run-id "energy_$name" --gpu-telemetry nvml --quiet \
      --tag gpu=h200 "${logflag[@]}" > "$O/run_$name.log" 2>&1
    echo "run $name: exit $?"; grep -E "J/token|note: (gpu_metrics|server_iterations)" \
      "$O/run_$name.log"
    sleep 5   # the idle power between runs, in the raw samples
  done
fi
kill -TERM $SAMPLER; wait $SAMPLER; cat "$O/sampler.log"

SL sql --db "$DB" --format csv "
SELECT e.run_id, r.variant, e.stage, e.level, e.method, e.gpus, e.samples,
  round(e.power_mean_w, 1) AS power_w, round(e.energy_j, 0) AS energy_j,
  round(e.output_tokens, 0) AS output_tokens,
  round(e.joules_per_output_token, 4) AS j_per_token,
  round(e.output_tokens_per_joule, 2) AS tokens_per_j,
  round(e.util_mean_pct, 1) AS util_pct, round(e.sm_clock_mean_mhz, 0) AS sm_mhz,
  round(e.mem_used_max_mib, 0) AS mem_mib, e.temp_max_c, round(e.power_max_w, 1) AS power_max_w
FROM gpu_stage_energy e JOIN runs r USING (run_id) ORDER BY e.level, r.variant" \
  | tee "$O/energy.csv"
SL sql --db "$DB" --format csv "
SELECT run_id, count(*) AS iterations, sum(context_tokens) AS context_tokens,
  sum(generation_tokens) AS generation_tokens FROM server_iterations GROUP BY run_id" \
  | tee "$O/iterations.csv"
for run in energy_bf16 energy_fp8; do SL summary "$run" --db "$DB" > "$O/summary_$run.txt" 2>&1; done
[ -z "${REUSE_DB:-}" ] && SL compare energy_bf16 energy_fp8 --db "$DB" > "$O/compare.txt" 2>&1
wc -l "$O/nvml_samples.jsonl"
gzip -9 -k "$O/nvml_samples.jsonl"
tar -C "$O" -czf "$O/gpu_telemetry.tgz" nvml_samples.jsonl.gz nvml_probe.txt nvidia_smi_q.txt \
  energy.csv iterations.csv sampler.log $(cd "$O" && ls run_*.log summary_*.txt compare.txt \
  2>/dev/null)
ls -la "$O"
