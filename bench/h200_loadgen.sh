#!/bin/bash
# Issue 19's load-generator figures on the lent H200 host (16 cores; no GPU needed), run from the
# project root after ../shared/device's set-up has put servelab's wheels on PYTHONPATH:
#   bash bench/h200_loadgen.sh OUTDIR [OLD_CHECKOUT]
# 1. bench/tail.py: the mock on cores 2-3, every client pinned to core 4, 128/256/384 streams,
#    HEAD beside OLD (cores 0-1 and 6-15 are left to whatever else runs: a vLLM start, say).
# 2. bench/scale.py: servelab on cores 5-15 (its --workers auto counts them), the mock on 0-4 (5
#    processes): 5,000 and 10,000 users, and 8,000 users on 10 workers with a /metrics page that
#    is no Prometheus text (the case that lost rows).
set -u
OUTDIR=$1; OLD=${2:-}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
HOMES=(); [ -n "$OLD" ] && HOMES=(--home "old=$OLD")
python3 bench/tail.py --levels 128,256,384 --warmup 5 --hold 15 --server-cores 2-3 \
  --client-cores 4 --mock-processes 2 "${HOMES[@]}" > "$OUTDIR/tail.txt" 2>&1
SCALE="--mock-processes 5 --server-cores 0-4 --client-cores 5-15 --warmup 5 --hold 15"
for users in 5000 10000; do
  python3 bench/scale.py --users $users --workers auto $SCALE > "$OUTDIR/scale_$users.txt" 2>&1
done
python3 bench/scale.py --users 8000 --workers 10 $SCALE --metrics-body '{}' \
  > "$OUTDIR/scale_8000_json_metrics.txt" 2>&1
tail -n 30 "$OUTDIR"/*.txt
