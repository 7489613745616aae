#!/bin/bash
# Issue 19 point 1 on the lent H200 host (16 cores; no GPU needed): bench/tail.py's table for the
# working tree beside the committed code, then a py-spy profile of the working tree at 256
# streams. Run from the project root with servelab's wheels on PYTHONPATH (../shared/device's
# set-up puts them in /tmp/sl), after `git archive --format=tar.gz -o .device/h19/head.tar.gz
# HEAD src loadtests pyproject.toml` here (the device copy has no git history):
#   bash bench/h200_tail.sh OUTDIR [LEVELS] [HOLD]
# The mock runs on cores 2-3 (2 processes), every client pinned to core 4, as h200_loadgen.sh.
# EXTRA_HOMES="--home NAME=DIR ..." measures more checkouts beside them; NOPROFILE=1 skips py-spy.
set -u
OUTDIR=$1; LEVELS=${2:-128,256,384}; HOLD=${3:-15}
mkdir -p "$OUTDIR" /tmp/h19head
export PYTHONUNBUFFERED=1
tar -xzf .device/h19/head.tar.gz -C /tmp/h19head
python3 bench/tail.py --levels "$LEVELS" --warmup 5 --hold "$HOLD" --server-cores 2-3 \
  --client-cores 4 --mock-processes 2 --home HEAD=/tmp/h19head ${EXTRA_HOMES:-} > "$OUTDIR/tail.txt" 2>&1
cat "$OUTDIR/tail.txt"
if [ -z "${NOPROFILE:-}" ] && { command -v py-spy >/dev/null 2>&1 || [ -x /tmp/sl/bin/py-spy ]; }; then
  SPY=$(command -v py-spy || echo /tmp/sl/bin/py-spy)
  T=$(mktemp -d)
  taskset -c 2-3 python3 bench/calibration_server.py --port 0 --ready-file "$T/ready" \
    --ttft-ms 50 --itl-ms 10 --no-metrics --processes 2 > "$T/mock.log" 2>&1 &
  MOCK=$!
  while [ ! -s "$T/ready" ]; do sleep 0.2; done
  printf 'name: tail_bench\ndescription: profile\nendpoint: chat\nmodel: auto\nsalt: false\nclasses:\n  - name: chat\n    prompt_tokens: 32\n    output_tokens: 128\nload:\n  concurrency: {levels: [256], warmup: 5s, hold: 15s}\n' > "$T/p.yaml"
  taskset -c 4 python3 -m servelab.cli run --profile "$T/p.yaml" --target "$(head -1 "$T/ready")" \
    --workers 0 --db "$T/db.duckdb" --spool-dir "$T/spool" --quiet > "$OUTDIR/profile_run.log" 2>&1 &
  RUN=$!
  sleep 10
  "$SPY" record --nonblocking --subprocesses -r 250 -d 10 -f raw -o "$OUTDIR/profile_256.txt" --pid $RUN \
    > "$OUTDIR/pyspy.log" 2>&1
  wait $RUN
  kill $MOCK
fi
