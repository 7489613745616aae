#!/bin/bash
# One lease of the lent H200 for issues 21, 22 and 23, in steps that each fit one device call:
#   bash bench/h200_lease.sh start      four real vLLM 0.26 servers at once on the one GPU: bf16
#                                       :8000, fp8 :8001, gptq_int4 :8002, awq_int4 :8003 (the
#                                       calibration probes' flags: dummy weights, max-model-len
#                                       4096, a fixed 20 GiB KV cache each), every one with its
#                                       per-request spans (OTLP to 127.0.0.1:4318, where each
#                                       servelab run listens) and every engine iteration logged
#   bash bench/h200_lease.sh phases V.. traffic_profiles/h200_phases.yaml (1/16/64/128 users) on
#                                       each variant, NVML sampled, the server's log ingested
#   bash bench/h200_lease.sh fidelity V the held-out workloads of bench/fidelity_workloads
#   bash bench/h200_lease.sh collect    /metrics pages, logs, CPU samples, nvidia-smi -> $OUT
# The int4 folders are the kit's BF16 folder with a quantization_config in config.json: vLLM
# then builds GPTQ/AWQ layers (Marlin kernels) and --load-format dummy fills them with random
# int4 weights, so speed and memory are real and the text is noise. One run at a time: the idle
# servers hold memory, no compute (their share of the board's power is in every J/token figure).
#
# Getting there (../shared/device's kit; the tree is ~27 MB, so its 94 MB payload no longer fits
# two calls of 64 MiB): here, `cat .device/w1/part.00 .device/w2/part.01 | split -b 31500000 - P`
# into .device/c1 (with payload.sha256, setup.sh), c2, c3; there, three calls carrying one each
# (`cp .device/cN/* /tmp/chunks/`), then one carrying .device/w3, .device/w4 (opentelemetry-proto,
# protobuf, nvidia-ml-py) and a tar of the tree: `cat /tmp/chunks/P* > /tmp/chunks/part.00;
# : > /tmp/chunks/part.01; cp .device/w3/*.whl .device/w4/*.whl /tmp/w3/; bash
# /tmp/chunks/setup.sh`, then `start`. Budget: ~200 s to start four servers, ~95 s a phases run,
# ~115 s a fidelity workload; each call under 600 s and within 30 s of the last.
set -u
W=/tmp/lease; Q=$W/quant; mkdir -p $W/logs $Q; O=${OUT:-/tmp/out}; mkdir -p "$O"
export PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1
SL() { env PYTHONPATH=${PYTHONPATH:-/tmp/sl:src} python3 -m servelab.cli "$@"; }
M=/tmp/vllm/qwen2_5_7b
declare -A PORT=([bf16]=8000 [fp8]=8001 [gptq_int4]=8002 [awq_int4]=8003)
declare -A FOLDER=([bf16]=$M [fp8]=$M [gptq_int4]=${M}_gptq [awq_int4]=${M}_awq)
declare -A EXTRA=([bf16]="" [fp8]="--quantization fp8" [gptq_int4]="" [awq_int4]="")
# PHASES_HOLD=8 shortens the phases profile's holds (and warm-ups to 3 s) when device time is short.
PHASES=traffic_profiles/h200_phases.yaml
if [ -n "${PHASES_HOLD:-}" ]; then
  sed "s/warmup: 5s, hold: 15s/warmup: 3s, hold: ${PHASES_HOLD}s/" $PHASES > $W/h200_phases.yaml
  PHASES=$W/h200_phases.yaml
fi
T0=$(date +%s); log() { echo "+$(( $(date +%s) - T0 ))s $*" | tee -a $W/timeline.log; }

start() {
  local vs=("${@:-bf16 fp8 gptq_int4 awq_int4}"); vs=(${vs[@]}); echo "${vs[@]}" > $W/variants.txt
  bash bench/h200_int4.sh folders | tee $W/folders.txt
  for v in "${vs[@]}"; do
    cmd="/tmp/bin/vllm serve ${FOLDER[$v]} --load-format dummy --max-model-len 4096 --gpu-memory-utilization 0.2 --kv-cache-memory-bytes 20G --host 127.0.0.1 --port ${PORT[$v]} --enable-logging-iteration-details --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces ${EXTRA[$v]}"
    mkdir -p $Q/$v; echo "$cmd" > $Q/$v/cmd.txt
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=500 OTEL_SERVICE_NAME=vllm \
      setsid $cmd > $Q/$v/startup.log 2>&1 < /dev/null &
    echo $! > $Q/$v/pid
  done
  log "${#vs[@]} servers started"
  # NVML across the whole lease (idle, every run, idle again): the raw fixture for CI
  setsid env PYTHONPATH=${PYTHONPATH:-/tmp/sl:src} python3 -m servelab.orchestration.gpu_telemetry \
    --out $W/nvml_samples.jsonl --interval 0.25 > $W/sampler.log 2>&1 < /dev/null &
  for v in "${vs[@]}"; do
    for _ in $(seq 600); do
      curl -sf -o /dev/null --max-time 2 http://127.0.0.1:${PORT[$v]}/health && break
      kill -0 "$(cat $Q/$v/pid)" 2>/dev/null || break; sleep 0.5
    done
    if curl -sf -o /dev/null --max-time 2 http://127.0.0.1:${PORT[$v]}/health; then log "$v ready"
    else log "$v NOT ready"; tail -30 $Q/$v/startup.log; fi
  done
  for v in "${vs[@]}"; do  # the first request compiles the sampler: warm up
    for _ in 1 2 3; do curl -s --max-time 60 http://127.0.0.1:${PORT[$v]}/v1/completions \
      -H 'Content-Type: application/json' \
      -d '{"model":"'${FOLDER[$v]}'","prompt":"warm up","max_tokens":16}' > /dev/null; done
    curl -s http://127.0.0.1:${PORT[$v]}/metrics > $W/logs/${v}_metrics_start.txt
  done
  log warmed
  # setsid, like the servers: a plain background job ends with the device call that started it
  cat > $W/cpu_sampler.py <<'PY'
import psutil, time
print("unix,role,port,pid,cpu_percent")
ps = []
for p in psutil.process_iter(['pid', 'cmdline']):
    c = p.info['cmdline'] or []
    if 'serve' in c and '--port' in c and any('vllm' in x for x in c):
        port = c[c.index('--port') + 1]
        ps.append(('api_server', port, p))
        ps += [('engine_core' if 'enginecore' in (ch.name() + ' '.join(ch.cmdline())).lower()
                else 'child', port, ch) for ch in p.children(recursive=True)]
for *_, p in ps: p.cpu_percent(None)
while True:
    time.sleep(0.5)
    for r, port, p in ps:
        try: print(f"{time.time():.2f},{r},{port},{p.pid},{p.cpu_percent(None):.0f}", flush=True)
        except Exception: pass
PY
  setsid python3 $W/cpu_sampler.py > $W/cpu.csv 2>&1 < /dev/null &
  echo $! > $W/cpu.pid
  nvidia-smi > $W/nvidia-smi_up.txt 2>&1
}

one_run() {  # $1 variant, $2 profile, $3 run id, $4 db
  local v=$1
  curl -s http://127.0.0.1:${PORT[$v]}/metrics > $W/logs/${v}_${3}_metrics_before.txt
  SERVELAB_MODEL=$M SERVELAB_MODEL_GPTQ=${M}_gptq SERVELAB_MODEL_AWQ=${M}_awq SL run --profile "$2" --target http://127.0.0.1:${PORT[$v]} \
    --variant $v --db "$4" --run-id "$3" --otlp-port 4318 --gpu-telemetry nvml \
    --log $Q/$v/startup.log --quiet --tag gpu=h200 > $W/logs/run_${v}_$3.log 2>&1
  log "run $v $3 rc=$?"
  curl -s http://127.0.0.1:${PORT[$v]}/metrics > $W/logs/${v}_${3}_metrics_after.txt
  grep -E "server phases|clock offset|J/token|error|Error" $W/logs/run_${v}_$3.log | head -12
}

# One database per variant in bench/h200_int4.sh's layout (run.duckdb, cmd.txt, verify.txt), so
# bench/quant_table.py reads the four for the seed's quantization table.
phases() {
  for v in "$@"; do
    SERVELAB_MODEL=$M SERVELAB_MODEL_GPTQ=${M}_gptq SERVELAB_MODEL_AWQ=${M}_awq SL verify $v \
      --log $Q/$v/startup.log --url http://127.0.0.1:${PORT[$v]} > $Q/$v/verify.txt 2>&1
    log "verify $v: $(head -1 $Q/$v/verify.txt)"; grep -E 'precision|version|kernel' $Q/$v/verify.txt
    one_run $v $PHASES phases_$v $Q/$v/run.duckdb
    # at once, so a call cut at its time limit still brings back every run it finished
    tar -czf "$O/quant_$v.tgz" --exclude=startup.log --exclude=pid -C $Q $v
  done
  cp $PHASES $Q/
}
fidelity() {
  for v in "$@"; do for w in rag_chat code_gen; do
    mkdir -p $W/fidelity_$v; cp $Q/$v/cmd.txt $W/fidelity_$v/
    # run id = the profile's name: bench/fidelity_capture.py replays each run by it
    one_run $v bench/fidelity_workloads/$w.yaml $w $W/fidelity_$v/capture.duckdb
  done; done
}
collect() {
  kill "$(cat $W/cpu.pid)" 2>/dev/null
  for v in $(cat $W/variants.txt); do
    curl -s http://127.0.0.1:${PORT[$v]}/metrics > $W/logs/${v}_metrics_end.txt
    curl -s http://127.0.0.1:${PORT[$v]}/version > $W/logs/${v}_version.txt
  done
  nvidia-smi > $W/nvidia-smi_end.txt 2>&1
  tar -czf "$O/lease_logs.tgz" --exclude=spool --exclude='*.duckdb*' --exclude='fidelity_*' -C /tmp lease
  ls -la "$O"
}

step=$1; shift
case $step in
  start) start "$@" ;;
  # At most 16 MB a file comes back: one archive per variant and step, the servers' logs at the end.
  phases) phases "$@"; ls -la "$O" ;;
  fidelity) fidelity "$@"; for v in "$@"; do tar -czf "$O/fidelity_$v.tgz" -C $W fidelity_$v; done
            ls -la "$O" ;;
  collect) collect "${1:-final}" ;;
  *) echo "usage: $0 start|phases V..|fidelity V..|collect" >&2; exit 2 ;;
esac
