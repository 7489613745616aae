#!/bin/bash
# Issue 23 on a real H200: the Int4 kernels (GPTQ 4-bit group 128, AWQ W4A16) measured the way
# BF16 and FP8 are, for the seed's quantization table (bench/quant_table.py reads what this writes).
#
# Runs on the lent device after the kit's three calls (../shared/device/README.md: /tmp/bin/vllm,
# the model folder /tmp/vllm/qwen2_5_7b with dummy weights, servelab under PYTHONPATH=/tmp/sl:src),
# from the checkout's root:
#   bash bench/h200_int4.sh start [VARIANT ...]      make the Int4 folders, start vllm serve per
#                                                    variant in the background (default: gptq_int4
#                                                    awq_int4) and return at once
#   bash bench/h200_int4.sh measure PORT:VARIANT ... per server, one at a time: wait until healthy,
#                                                    warm up, servelab verify on its real log,
#                                                    servelab run on traffic_profiles/h200_quant.yaml
#   bash bench/h200_int4.sh pack                     tar the results into $OUT
#   bash bench/h200_int4.sh stop                     SIGTERM every server this script started
#   bash bench/h200_int4.sh all                      start + measure 8002:gptq_int4 8003:awq_int4
#                                                    + pack + stop (one call, about 5.5 minutes)
# Ports: bf16 8000, fp8 8001, gptq_int4 8002, awq_int4 8003. The lead's BF16/FP8 pair goes the same
# way (`start bf16 fp8`, `measure 8000:bf16 8001:fp8`) so all four share flags and profile.
#
# Why the quantization_config fields: vLLM 0.26 maps quant_method gptq/awq to AutoGPTQConfig /
# AutoAWQConfig (model_executor/layers/quantization/auto_gptq.py, auto_awq.py: bits, group_size,
# desc_act and sym are required for GPTQ; bits, group_size and zero_point for AWQ). With no
# safetensors in the folder, their maybe_update_config reads an empty weight list: for AWQ that
# means "convert every linear layer" (modules_to_not_convert stays empty), but for GPTQ it means
# modules_in_block_to_quantize = [] and every layer silently stays BF16 (is_layer_gptq_quantized
# is false for all). So the GPTQ folder names the quantized modules as GPTQModel writes them for
# Qwen2. The dummy loader leaves integer tensors (qweight, qzeros, g_idx) uninitialised and fills
# the 16-bit scales with small random values: the real kernels run on meaningless weights.
#
# Memory, per server: --kv-cache-memory-bytes 20G (20 GiB, vLLM's binary G) skips the memory
# profile; Int4 weights ~5.5 GiB (4-bit linears, 16-bit embeddings and lm_head), activations ~1.1,
# CUDA graphs ~0.9, context ~0.5: ~28 GiB. BF16 ~37 GiB, FP8 ~31 GiB. All four: ~125 GiB of the
# H200's 139.8 GiB. --gpu-memory-utilization 0.2 asks for 28 GiB free at start (vLLM refuses to
# start below that), which holds while the others run.
set -u
RES=${RES:-/tmp/quant_h200}
OUT=${OUT:-/tmp/out}
BASE=${BASE_MODEL:-/tmp/vllm/qwen2_5_7b}
VLLM=${VLLM:-/tmp/bin/vllm}
PROFILE=${PROFILE:-traffic_profiles/h200_quant.yaml}
COMMON=(--load-format dummy --max-model-len 4096 --gpu-memory-utilization 0.2
        --kv-cache-memory-bytes 20G --host 127.0.0.1)
export SERVELAB_MODEL=${SERVELAB_MODEL:-$BASE} SERVELAB_MODEL_GPTQ=${SERVELAB_MODEL_GPTQ:-${BASE}_gptq} \
  SERVELAB_MODEL_AWQ=${SERVELAB_MODEL_AWQ:-${BASE}_awq}
mkdir -p "$RES" "$OUT"
SL() { env PYTHONPATH=${PYTHONPATH:-/tmp/sl:src} PYTHONUNBUFFERED=1 python3 -m servelab.cli "$@"; }
say() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$RES/timeline.log"; }

port_of() { case $1 in bf16) echo 8000;; fp8) echo 8001;; gptq_int4) echo 8002;;
                       awq_int4) echo 8003;; *) echo "unknown variant $1" >&2; return 1;; esac; }
folder_of() { case $1 in gptq_int4) echo "${BASE}_gptq";; awq_int4) echo "${BASE}_awq";;
                         *) echo "$BASE";; esac; }
flags_of() { [ "$1" = fp8 ] && echo "--quantization fp8"; return 0; }

folders() {
  python3 - "$BASE" <<'PY'
import json, shutil, sys
from pathlib import Path
base = Path(sys.argv[1])
configs = {
    "_gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
              "sym": True, "lm_head": False,
              "modules_in_block_to_quantize": [
                  ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"],
                  ["self_attn.o_proj"], ["mlp.up_proj", "mlp.gate_proj"], ["mlp.down_proj"]]},
    "_awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
             "version": "gemm"},
}
for suffix, quant in configs.items():
    dst = base.with_name(base.name + suffix)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(base, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quant
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{dst}: quantization_config {json.dumps(quant)}")
PY
}

start() {
  folders | tee "$RES/folders.txt"
  nvidia-smi --query-gpu=memory.used,memory.free --format=csv | tee "$RES/gpu_before_start.csv"
  for v in "${@:-gptq_int4 awq_int4}"; do
    for variant in $v; do
      port=$(port_of "$variant") || return 1
      mkdir -p "$RES/$variant"
      cmd=("$VLLM" serve "$(folder_of "$variant")" "${COMMON[@]}" --port "$port" $(flags_of "$variant")
           ${EXTRA_VLLM_ARGS:-})
      printf '%q ' "${cmd[@]}" > "$RES/$variant/cmd.txt"; echo >> "$RES/$variant/cmd.txt"
      date +%s.%N > "$RES/$variant/t_start_epoch.txt"
      setsid "${cmd[@]}" > "$RES/$variant/startup.log" 2>&1 < /dev/null &
      echo $! > "$RES/$variant/pid"
      say "started $variant on $port (pid $!)"
    done
  done
}

wait_healthy() {  # PORT VARIANT: up to 300 s (the kit measured 125-145 s from cold)
  local t0=$(date +%s)
  until curl -sf --max-time 2 "http://127.0.0.1:$1/health" > /dev/null; do
    if [ $(( $(date +%s) - t0 )) -gt 300 ]; then say "$2: not healthy after 300 s"; return 1; fi
    if [ -f "$RES/$2/pid" ] && ! kill -0 "$(cat "$RES/$2/pid")" 2>/dev/null; then
      say "$2: vllm exited"; tail -5 "$RES/$2/startup.log"; return 1
    fi
    sleep 1
  done
  date +%s.%N > "$RES/$2/t_ready_epoch.txt"
  say "$2 healthy on $1"
}

measure_one() {  # PORT:VARIANT[:LOG]
  local port=${1%%:*} rest=${1#*:}; local variant=${rest%%:*} log=${rest#*:}
  [ "$log" = "$variant" ] && log=$RES/$variant/startup.log
  local url=http://127.0.0.1:$port dir=$RES/$variant
  mkdir -p "$dir"
  wait_healthy "$port" "$variant" || return 1
  curl -s --max-time 10 "$url/version" > "$dir/version.json"
  curl -s --max-time 10 "$url/metrics" > "$dir/metrics_before.txt"
  # The first request compiles a Triton sampler kernel (TTFT 4-8 s): two warm-ups, not measured.
  for i in 1 2; do
    curl -s --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' -d \
      "{\"model\": \"$(folder_of "$variant")\", \"prompt\": \"warm up $i\", \"max_tokens\": 16}" \
      > "$dir/warmup_$i.json"
  done
  SL verify "$variant" --log "$log" --url "$url" > "$dir/verify.txt" 2>&1
  say "verify $variant: $(head -1 "$dir/verify.txt")"; grep -E 'precision|version' "$dir/verify.txt"
  SL run --profile "$PROFILE" --target "$url" --variant "$variant" --log "$log" \
    --db "$dir/run.duckdb" --run-id "quant_$variant" --tag gpu=h200 --tag vllm=0.26.0 \
    --tag flags=kv20G_len4096 --quiet > "$dir/run.txt" 2>&1
  say "run $variant: exit $?"; tail -12 "$dir/run.txt"
  curl -s --max-time 10 "$url/metrics" > "$dir/metrics_after.txt"
  nvidia-smi --query-gpu=memory.used,utilization.gpu,power.draw --format=csv > "$dir/nvidia-smi.csv"
}

measure() { for pair in "$@"; do measure_one "$pair"; done; }

stop() {
  for f in "$RES"/*/pid; do
    [ -f "$f" ] || continue
    kill -TERM -- "-$(cat "$f")" 2>/dev/null && say "stopped $(basename "$(dirname "$f")")"
    rm -f "$f"
  done
}

pack() {
  cp "$PROFILE" "$RES/"
  tar -C "$(dirname "$RES")" -cJf "$OUT/quant_h200.tar.xz" "$(basename "$RES")"
  ls -la "$OUT"
}

case ${1:-all} in
  folders) folders ;;
  start) shift; start "$@" ;;
  measure) shift; measure "$@" ;;
  pack) pack ;;
  stop) stop ;;
  all) start gptq_int4 awq_int4 && measure 8002:gptq_int4 8003:awq_int4; pack; stop ;;
  *) sed -n 2,22p "$0"; exit 2 ;;
esac
