#!/bin/bash
# Device side: capture real vLLM artefacts for every variant in turn, in the background.
#   setsid bash /tmp/slsnap/cap/capture_all.sh DEADLINE_EPOCH > /tmp/cap/master.log 2>&1 &
# Writes /tmp/cap/<variant>/..., /tmp/cap/timeline.log; touches /tmp/cap/DONE at the end.
# A step is skipped when less time is left before DEADLINE_EPOCH than it needs (or /tmp/cap/STOP).
set -u
DEADLINE=$1
SNAP=${SNAP:-/tmp/slsnap}; CAP=${CAP:-/tmp/cap}; VLLM=${VLLM:-/tmp/bin/vllm}
MODEL=${MODEL:-/tmp/vllm/qwen2_5_7b}; PY=${PY:-python3}; BENCH=${BENCH:-/tmp/chunks/bench_multi.py}
SLPP=${SLPP:-/tmp/sl:$SNAP/src}; VPP=${VPP:-/tmp/vllm/site}
ONLY=${ONLY:-bf16 fp8 failed_start spec_ngram tuned kv_fp8 no_prefix_cache}
PORT=8000; URL=http://127.0.0.1:$PORT
T0=$(date +%s)
mkdir -p $CAP/gpu $CAP/bench
TL=$CAP/timeline.log
ts() { echo "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) epoch=$(date +%s.%N | cut -c1-14) +$(( $(date +%s) - T0 ))s left=$(( DEADLINE - $(date +%s) ))s  $*" | tee -a $TL; }
left() { echo $(( DEADLINE - $(date +%s) )); }
sl() { env PYTHONPATH=$SLPP $PY -m servelab.cli "$@"; }
cd $SNAP

# alive PGID: any non-zombie process in the server's process group
alive() { ps -e -o pgid=,stat= | awk -v g="$1" '$1==g && $2 !~ /^Z/ {f=1} END {exit !f}'; }
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }

gpu_snap() {  # DIR SUFFIX
  local d=$1 s=$2; mkdir -p $d
  nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,memory.free,driver_version --format=csv > $d/nvidia-smi_query_$s.csv 2>&1
  nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,memory.free,driver_version --format=csv,noheader,nounits > $d/nvidia-smi_query_${s}_noheader_nounits.csv 2>&1
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,memory.used --format=csv > $d/nvidia-smi_preflight_query_$s.csv 2>&1
  nvidia-smi > $d/nvidia-smi_$s.txt 2>&1
  nvidia-smi topo -m > $d/nvidia-smi_topo_$s.txt 2>&1
  nvidia-smi -q > $d/nvidia-smi-q_full_$s.txt 2>&1
  head -100 $d/nvidia-smi-q_full_$s.txt > $d/nvidia-smi-q_head100_$s.txt
}

start_server() {  # NAME FLAGS... (after the model)
  NAME=$1; shift; D=$CAP/$NAME; mkdir -p $D
  local u; for i in $(seq 120); do u=$(gpu_used); [ -z "$u" ] && break; [ "$u" -lt 1500 ] && break; sleep 0.25; done
  printf '%q ' "$VLLM" serve "$MODEL" "$@" > $D/cmd.txt; echo >> $D/cmd.txt
  ts "$NAME: server start: $(cat $D/cmd.txt)"
  T_START=$(date +%s.%N)
  echo "$T_START" > $D/t_start_epoch.txt
  setsid "$VLLM" serve "$MODEL" "$@" > $D/startup.log 2>&1 &
  SPID=$!
  echo $SPID > $D/server.pid
}

wait_ready() {  # TIMEOUT_S ; 0 ready, 1 exited, 2 timeout
  local to=$1 t0; t0=$(date +%s)
  while true; do
    if curl -sf -o /dev/null --max-time 2 $URL/health; then
      local now; now=$(date +%s.%N)
      echo "$now" > $D/t_ready_epoch.txt
      awk "BEGIN{printf \"%.1f\n\", $now - $T_START}" > $D/ready_after_s.txt
      ts "$NAME: ready after $(cat $D/ready_after_s.txt) s"; return 0
    fi
    if ! alive $SPID; then
      wait $SPID; local rc=$?
      echo $rc > $D/exit_code.txt
      awk "BEGIN{printf \"%.1f\n\", $(date +%s.%N) - $T_START}" > $D/exited_after_s.txt
      ts "$NAME: server exited rc=$rc after $(cat $D/exited_after_s.txt) s, before ready"; return 1
    fi
    if (( $(date +%s) - t0 > to )); then ts "$NAME: not ready after $to s"; return 2; fi
    sleep 0.5
  done
}

stop_server() {
  ts "$NAME: stopping server (SIGTERM to process group $SPID)"
  kill -TERM -- -$SPID 2>/dev/null
  for i in $(seq 80); do alive $SPID || break; sleep 0.25; done
  if alive $SPID; then ts "$NAME: still alive after 20 s, SIGKILL"; kill -KILL -- -$SPID 2>/dev/null; sleep 1; fi
  wait $SPID 2>/dev/null; echo $? > $D/exit_code_after_sigterm.txt
  local u=0
  for i in $(seq 120); do u=$(gpu_used); [ -z "$u" ] && break; [ "$u" -lt 1500 ] && break; sleep 0.25; done
  ts "$NAME: server gone (rc $(cat $D/exit_code_after_sigterm.txt)), GPU memory used ${u:-?} MiB"
}

after_ready() {  # capture the server's pages right after ready, before any load
  curl -s --max-time 10 $URL/metrics > $D/metrics_before.txt
  curl -s --max-time 10 $URL/v1/models > $D/models.json
  curl -s --max-time 10 -w '\nHTTP %{http_code}\n' $URL/version > $D/version.txt
  curl -s --max-time 10 -w '\nHTTP %{http_code}\n' -X POST $URL/tokenize -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"Hello, my name is\"}" > $D/tokenize_probe.txt
  nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,memory.free,driver_version --format=csv > $D/nvidia-smi_query_up.csv 2>&1
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,memory.used --format=csv > $D/nvidia-smi_preflight_query_up.csv 2>&1
  ts "$NAME: pages saved"
}

warmup() {
  for i in 1 2; do
    curl -s --max-time 60 -w '\nHTTP %{http_code} time_total %{time_total} s\n' $URL/v1/completions \
      -H 'Content-Type: application/json' \
      -d "{\"model\": \"$MODEL\", \"prompt\": \"Warm-up request $i: the quick brown fox\", \"max_tokens\": 16, \"temperature\": 0}" \
      > $D/warmup_$i.txt
  done
  ts "$NAME: warm-up done: $(tail -1 $D/warmup_1.txt) / $(tail -1 $D/warmup_2.txt)"
  curl -s --max-time 10 $URL/metrics > $D/metrics_after_warmup.txt
}

servelab_load() {  # PROFILE RUN_ID
  local prof=$1 rid=$2
  ts "$NAME: servelab run $rid ($prof) start"
  echo "cd $SNAP && PYTHONPATH=$SLPP $PY -m servelab.cli run --profile $prof --target $URL --variant $NAME --db $D/servelab.duckdb --run-id $rid --tag gpu=h200 --tag weights=dummy --tag vllm=0.26.0 --quiet" > $D/servelab_cmd.txt
  timeout 300 env PYTHONPATH=$SLPP $PY -m servelab.cli run --profile $prof --target $URL --variant $NAME \
    --db $D/servelab.duckdb --run-id $rid --tag gpu=h200 --tag weights=dummy --tag vllm=0.26.0 --quiet \
    > $D/servelab_run.txt 2>&1
  echo $? > $D/servelab_run_rc.txt
  ts "$NAME: servelab run rc=$(cat $D/servelab_run_rc.txt)"
  curl -s --max-time 10 $URL/metrics > $D/metrics_after.txt
}

verify_live() {  # VARIANT_ARG
  local v=$1
  (echo "\$ servelab verify $v --url $URL --log $D/startup.log --gpus $D/nvidia-smi_preflight_query_up.csv"
   timeout 60 env PYTHONPATH=$SLPP $PY -m servelab.cli verify $v --url $URL --log $D/startup.log --gpus $D/nvidia-smi_preflight_query_up.csv 2>&1
   echo "exit status $?") > $D/verify.txt
  (echo "\$ SERVELAB_MODEL=$MODEL servelab verify $v --url $URL --log $D/startup.log --db $D/servelab.duckdb --run ${NAME}_servelab"
   SERVELAB_MODEL=$MODEL timeout 60 env PYTHONPATH=$SLPP $PY -m servelab.cli verify $v --url $URL --log $D/startup.log \
     --db $D/servelab.duckdb --run ${NAME}_servelab 2>&1
   echo "exit status $?") > $D/verify_model_env.txt
  (echo "\$ servelab preflight $v   # live, while the server holds the GPU"
   timeout 60 env PYTHONPATH=$SLPP $PY -m servelab.cli preflight $v 2>&1; echo "exit status $?") > $D/preflight_live.txt
  ts "$NAME: verify: $(head -2 $D/verify.txt | tail -1) | model_env: $(sed -n 2p $D/verify_model_env.txt)"
}

post_db() {  # D VARIANT_ARG (CPU only; runs in the background while the next server loads)
  local d=$1 v=$2 db=$1/servelab.duckdb
  (echo "\$ servelab summary latest --db $db"; sl summary latest --db $db 2>&1; echo "exit status $?") > $d/servelab_summary.txt
  sl sql --db $db --format csv "SELECT run_id, stage, level, requests, completed, errors, window_s, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, itl_p50_ms, itl_p99_ms, itl_chunk_p50_ms, itl_chunk_p99_ms, e2e_p50_ms, output_tokens_per_s, requests_per_s, prompt_tokens_mean, output_tokens_mean, tokens_per_chunk_mean, cached_prompt_share FROM stage_summary WHERE class_name = '(all)' ORDER BY stage" > $d/servelab_stage_figures.csv 2>&1
  sl sql --db $db --format csv "SELECT * FROM stage_summary ORDER BY stage, class_name" > $d/servelab_stage_summary_full.csv 2>&1
  sl sql --db $db --format csv "SELECT * FROM server_stage_summary ORDER BY ALL" > $d/servelab_server_stage_summary.csv 2>&1
  sl sql --db $db --format csv "SELECT stage, warmup, prompt_tokens_target, prompt_tokens, output_tokens_target, output_tokens, token_source, chunk_token_source, finish_reason, error_kind, count(*) AS n, min(cached_tokens) AS cached_min, max(cached_tokens) AS cached_max FROM requests GROUP BY ALL ORDER BY ALL" > $d/servelab_token_counts.csv 2>&1
  sl sql --db $db --format csv "SELECT error_kind, error_text, count(*) AS n FROM requests WHERE error_kind IS NOT NULL GROUP BY ALL" > $d/servelab_errors.csv 2>&1
  sl sql --db $db --format csv "SELECT run_id, status, model, target, variant, flags, verification FROM runs" > $d/servelab_runs.csv 2>&1
  (echo "\$ servelab preflight $v --gpus $CAP/gpu/nvidia-smi_preflight_query_idle.csv --topology $CAP/gpu/nvidia-smi_topo_idle.txt"
   sl preflight $v --gpus $CAP/gpu/nvidia-smi_preflight_query_idle.csv --topology $CAP/gpu/nvidia-smi_topo_idle.txt 2>&1; echo "exit status $?"
   echo; echo "\$ servelab preflight $v --gpus ... --profile $SNAP/cap/fixed_1024_256.yaml"
   sl preflight $v --gpus $CAP/gpu/nvidia-smi_preflight_query_idle.csv --profile $SNAP/cap/fixed_1024_256.yaml 2>&1; echo "exit status $?"
   echo; echo "\$ SERVELAB_MODEL=$MODEL servelab preflight $v --gpus ..."
   SERVELAB_MODEL=$MODEL env PYTHONPATH=$SLPP $PY -m servelab.cli preflight $v --gpus $CAP/gpu/nvidia-smi_preflight_query_idle.csv 2>&1; echo "exit status $?"
  ) > $d/preflight_idle_gpu.txt
  touch $d/db.done
}

want() { case " $ONLY " in *" $1 "*) ;; *) return 1;; esac; [ -f $CAP/STOP ] && { ts "$1: skipped (STOP)"; return 1; }
         local l; l=$(left); if (( l < $2 )); then ts "$1: skipped, $l s left, needs ~$2 s"; echo "skipped: $l s left before the deadline, needed ~$2 s" > $CAP/skipped_$1.txt; return 1; fi; }

BASE=(--load-format dummy --max-model-len 4096 --host 127.0.0.1 --port $PORT)
LEVELS="c1:1:16:256:1001 c16:16:64:256:1016 c64:64:256:256:1064 c256:256:512:256:1256"

full_variant() {  # NAME VERIFY_ARG FLAGS...
  local name=$1 v=$2; shift 2
  start_server $name "${BASE[@]}" "$@"
  local B=$CAP/bench/$name; mkdir -p $B $D/barrier
  # vLLM's own client: imports vLLM while the server starts, then waits at a barrier for our warm-up
  (cd /tmp && env PYTHONPATH=$VPP PYTHONUNBUFFERED=1 timeout 520 $PY $BENCH --model $MODEL --res $B --port $PORT \
     --deadline-epoch $DEADLINE --barrier $D/barrier --barrier-n 2 \
     --pack "f=\$(ls -t $B/*.json 2>/dev/null | head -1); [ -n \"\$f\" ] && curl -s $URL/metrics > \${f%.json}.metrics_after.txt" \
     $LEVELS > $B/bench_multi.out 2>&1) &
  local BPID=$!
  echo "cd /tmp && PYTHONPATH=$VPP python3 $BENCH --model $MODEL --res $B --port $PORT --deadline-epoch $DEADLINE --barrier $D/barrier --barrier-n 2 --pack '...curl /metrics...' $LEVELS" > $B/bench_cmd.txt
  if [ "$name" = bf16 ]; then (sleep 20; env PYTHONPATH=$VPP timeout 100 $PY -m vllm.collect_env > $CAP/gpu/vllm_collect_env.txt 2>&1) & fi
  if wait_ready 300; then
    after_ready
    [ "$name" = bf16 ] && gpu_snap $CAP/gpu server_up_bf16
    warmup
    for lv in $LEVELS; do touch $D/barrier/${lv%%:*}.go; done
    ts "$name: bench_multi released"
    wait $BPID; ts "$name: bench_multi done rc=$?"
    curl -s --max-time 10 $URL/metrics > $D/metrics_after_bench.txt
    if (( $(left) > 120 )); then servelab_load $SNAP/cap/fixed_1024_256.yaml ${name}_servelab; else ts "$name: servelab skipped (time)"; fi
    verify_live $v
    stop_server
    post_db $D $v &
  else
    kill $BPID 2>/dev/null; stop_server
  fi
}

short_variant() {  # NAME VERIFY_ARG FLAGS...
  local name=$1 v=$2; shift 2
  start_server $name "${BASE[@]}" "$@"
  if wait_ready 300; then
    after_ready
    warmup
    if (( $(left) > 60 )); then servelab_load $SNAP/cap/short_1_16.yaml ${name}_servelab; else ts "$name: servelab skipped (time)"; fi
    verify_live $v
    stop_server
    post_db $D $v &
  else
    stop_server
  fi
}

ts "master start, deadline $DEADLINE ($(date -u -d @$DEADLINE +%H:%M:%S) UTC), variants: $ONLY"
[ -f $CAP/gpu/nvidia-smi_preflight_query_idle.csv ] || gpu_snap $CAP/gpu idle
env PYTHONPATH=$VPP $PY -m pip list --path $VPP > $CAP/gpu/pip_list_vllm_site.txt 2>&1 &
$PY -m pip list > $CAP/gpu/pip_list_system.txt 2>&1 &
env PYTHONPATH=$SLPP $PY -m pip list --path /tmp/sl > $CAP/gpu/pip_list_servelab_deps.txt 2>&1 &

want bf16 420 && full_variant bf16 bf16
want fp8 400 && full_variant fp8 fp8 --quantization fp8
if want failed_start 80; then
  start_server failed_start --load-format dummy --max-model-len 32768 --gpu-memory-utilization 0.12 --host 127.0.0.1 --port $PORT
  if wait_ready 200; then after_ready; stop_server; else [ -f $D/exit_code.txt ] || stop_server; fi
  (echo "\$ servelab verify bf16 --log $D/startup.log"; sl verify bf16 --log $D/startup.log 2>&1; echo "exit status $?") > $D/verify.txt &
fi
want spec_ngram 165 && short_variant spec_ngram spec_ngram --speculative-config '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'
want tuned 165 && short_variant tuned tuned --gpu-memory-utilization 0.95 --max-num-batched-tokens 8192 --max-num-seqs 128
want kv_fp8 165 && short_variant kv_fp8 $SNAP/cap/variants/kv_fp8.yaml --kv-cache-dtype fp8
want no_prefix_cache 160 && short_variant no_prefix_cache $SNAP/cap/variants/no_prefix_cache.yaml --no-enable-prefix-caching
wait
ts "master done"
touch $CAP/DONE
