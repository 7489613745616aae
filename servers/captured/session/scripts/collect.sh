#!/bin/bash
# Device side: wait until the master is done (or MAXWAIT s), then pack /tmp/cap into $OUT.
#   bash /tmp/slsnap/cap/collect.sh MAXWAIT
CAP=${CAP:-/tmp/cap}; t0=$(date +%s)
while [ ! -f $CAP/DONE ] && (( $(date +%s) - t0 < $1 )); do sleep 2; done
echo "---- timeline (last 45 lines)"; tail -n 45 $CAP/timeline.log
echo "---- master.log tail"; tail -n 8 $CAP/master.log 2>/dev/null
cd $(dirname $CAP) && c=$(basename $CAP)
tar --exclude='*.duckdb' --exclude='*.duckdb.wal' --exclude='spool' -czf $OUT/cap_text.tar.gz $c
n=1
for d in $c/*/; do
  v=$(basename $d)
  if [ -f $d/db.done ] && [ -f $d/servelab.duckdb ] && [ $n -lt 8 ]; then
    tar -czf $OUT/db_$v.tar.gz $d/servelab.duckdb; n=$((n+1))
  fi
done
ls -la $OUT; [ -f $CAP/DONE ] && echo "MASTER DONE" || echo "MASTER STILL RUNNING"
