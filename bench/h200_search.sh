#!/bin/bash
# servelab search against real vLLM 0.26 on the lent H200 (issue 24), after ../shared/device's
# three set-up calls: bash bench/h200_search.sh start | bf16 | fp8 | report   (OUT: results)
# start: BF16 (port 8000) and FP8 (8001) side by side with the flags the shipped H200
# calibrations were fitted with (servers/calibration/probes/*.yaml), so predict seeds from them.
set -u
VLLM=/tmp/bin/vllm; MODEL=/tmp/vllm/qwen2_5_7b; SLPP=/tmp/sl:src:/tmp/vllm/site
LOGS=/tmp/search_logs; mkdir -p $LOGS
flags() { env PYTHONPATH=$SLPP python3 -c "import sys,yaml; print(' '.join(yaml.safe_load(open(sys.argv[1]))['serve_args']))" servers/calibration/probes/$1.yaml; }
case $1 in
start)
  setsid taskset -c 4-15 $VLLM serve $MODEL $(flags bf16) --host 127.0.0.1 --port 8000 > $LOGS/bf16_vllm.log 2>&1 &
  sleep 20
  setsid taskset -c 4-15 $VLLM serve $MODEL $(flags fp8) --host 127.0.0.1 --port 8001 > $LOGS/fp8_vllm.log 2>&1 &
  for _ in $(seq 400); do curl -sf -o /dev/null http://127.0.0.1:8000/health && curl -sf -o /dev/null http://127.0.0.1:8001/health && break; sleep 1; done
  for p in 8000 8001; do   # the first request compiles the sampler: not part of any probe
    curl -s http://127.0.0.1:$p/v1/completions -H 'Content-Type: application/json' \
      -d '{"model":"/tmp/vllm/qwen2_5_7b","prompt":"warm up","max_tokens":8}' > /dev/null
  done
  echo "ready after $SECONDS s";;
bf16|fp8)
  p=8000; [ $1 = fp8 ] && p=8001
  env PYTHONPATH=$SLPP PYTHONUNBUFFERED=1 python3 -m servelab.cli search \
    --profile traffic_profiles/code_completion.yaml --target http://127.0.0.1:$p \
    --variant servers/calibration/probes/$1.yaml --hardware H200 --slo-attainment 0.95 \
    --min 4 --max 256 --warmup 10 --hold 30 --workers 2 --log $LOGS/$1_vllm.log \
    --db $LOGS/search.duckdb --run-id h200-$1 --format json > $LOGS/search_$1.json 2> $LOGS/search_$1.log
  echo "exit $?"; cat $LOGS/search_$1.json | head -c 3000; tail -5 $LOGS/search_$1.log;;
report)
  env PYTHONPATH=$SLPP python3 -m servelab.cli report h200-bf16 h200-fp8 --db $LOGS/search.duckdb --out $LOGS/rep > $LOGS/report.log 2>&1
  tar -C /tmp -czf $OUT/search_logs.tgz search_logs; ls -la $OUT;;
esac
