#!/bin/bash
# On a GPU machine with the device kit set up (../shared/device/README.md): start BF16 and FP8
# vLLM servers side by side on one GPU (fixed KV caches, so neither one's memory profile sees the
# other), run `servelab calibrate` against each in turn (the other idles), and write the
# calibration files, logs and GPU facts to $OUT. Everything is written as it happens, so a call
# cut at its time limit still returns what finished.
#   bash servers/calibration/probes/probe.sh            (from the project root, OUT set)
set -u
VLLM=${VLLM:-/tmp/bin/vllm}; MODEL=${MODEL:-/tmp/vllm/qwen2_5_7b}; HW=${HW:-H200}
SLPP=${SLPP:-/tmp/sl:src:/tmp/vllm/site}; PY=${PY:-python3}; OUT=${OUT:?set OUT}
HERE=servers/calibration/probes; T0=$(date +%s)
log() { echo "+$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/timeline.log"; }
flags() { env PYTHONPATH=$SLPP "$PY" -c "import sys,yaml; print(' '.join(yaml.safe_load(open(sys.argv[1]))['serve_args']))" "$1"; }
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
start() {  # VARIANT PORT
  log "start $1 on :$2: $VLLM serve $MODEL $(flags $HERE/$1.yaml) --host 127.0.0.1 --port $2"
  setsid "$VLLM" serve "$MODEL" $(flags $HERE/$1.yaml) --host 127.0.0.1 --port "$2" \
    > "$OUT/$1_vllm.log" 2>&1 &
  echo $! > "/tmp/$1.pid"
}
ready() {  # VARIANT PORT TIMEOUT_S
  for _ in $(seq $(( $3 * 2 ))); do
    curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$2/health" && { log "$1 ready"; return 0; }
    kill -0 "$(cat /tmp/$1.pid)" 2>/dev/null || { log "$1 exited before ready"; return 1; }
    sleep 0.5
  done
  log "$1 not ready after $3 s"; return 1
}
warm() {  # PORT: the first request compiles the sampler (4-8 s); a second for steady state
  for _ in 1 2; do
    curl -s --max-time 60 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model":"'"$MODEL"'","prompt":"warm up","max_tokens":8}' > /dev/null
  done
}
calibrate() {  # VARIANT PORT
  log "calibrate $1"
  env PYTHONPATH=$SLPP "$PY" -m servelab.cli calibrate --target "http://127.0.0.1:$2" \
    --variant "$HERE/$1.yaml" --hardware "$HW" --repeat "${REPEAT:-2}" \
    --out "$OUT/$HW-Qwen--Qwen2.5-7B-Instruct-$1.yaml" > "$OUT/$1_calibrate.log" 2>&1
  log "calibrate $1 rc=$?"
  curl -s "http://127.0.0.1:$2/metrics" > "$OUT/$1_metrics_after.txt"
}
start bf16 8000
sleep "${STAGGER_S:-20}"   # the second start's init check must find 40% of the GPU still free
start fp8 8001
ok_bf16=0; ok_fp8=0
ready bf16 8000 "${READY_S:-240}" && ok_bf16=1
ready fp8 8001 "${READY_S:-240}" && ok_fp8=1
warmers=()
[ $ok_bf16 = 1 ] && { warm 8000 & warmers+=($!); }
[ $ok_fp8 = 1 ] && { warm 8001 & warmers+=($!); }
[ ${#warmers[@]} -gt 0 ] && wait "${warmers[@]}"   # not a bare wait: the servers are children too
[ $ok_bf16 = 1 ] && calibrate bf16 8000
[ $ok_fp8 = 1 ] && calibrate fp8 8001
for v in bf16 fp8; do kill -TERM -- -"$(cat /tmp/$v.pid)" 2>/dev/null; done
log "done"
