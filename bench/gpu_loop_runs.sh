#!/usr/bin/env bash
# program.md's loop on a GPU machine without git (the project's device machine): one `experiment.py` run per
# description, as the loop's step 6 runs it, with results.tsv kept where the next call on the warm machine finds it.
#   bash bench/gpu_loop_runs.sh "baseline (run 1)" "baseline (run 2)"
#   SUITE=chunked bash bench/gpu_loop_runs.sh "..."       # another suite (default: standard, what program.md decides on)
# The commit a row names is the local one the tree was synced from (the device has no git): pass it in the description.
# Logs, results.tsv and the experiment.py of each run go to $OUT (or ./out). On a GPU that is not SM120 the SM120
# kernels run emulated (label the figures so).
set -uo pipefail
OUT=${OUT:-out}
LOOP=${LOOP:-/opt/fa4tune-loop}
mkdir -p "$OUT" "$LOOP"
[ -f /opt/devsite/env.sh ] && . /opt/devsite/env.sh
export PYTHONUNBUFFERED=1 FA4TUNE_RESULTS_TSV="$LOOP/results.tsv"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
python3 -m fa4tune.guards | tail -1
n=$(ls "$LOOP" | grep -c '^run-' || true)
for description in "$@"; do
  n=$((n + 1))
  log="$LOOP/run-$n.log"
  cp experiment.py "$LOOP/experiment-$n.py"
  start=$(date +%s)
  timeout 600 python3 experiment.py --suite "${SUITE:-standard}" --description "$description" > "$log" 2>&1
  echo "run $n ($description): exit $? after $(( $(date +%s) - start )) s"
  grep "^fwd_tflops_geomean:\|^bwd_tflops_geomean:\|^fwd_spread_pct:\|^bwd_spread_pct:\|^configs_ok:\|^error:" "$log"
done
python3 -c "from fa4tune.harness.results_tsv import read_rows; [print(r.fwd_tflops_geomean, r.config.get('fwd_spread_pct'), r.bwd_tflops_geomean, r.config.get('bwd_spread_pct'), r.configs_ok, r.description, sep='  ') for r in read_rows('$LOOP/results.tsv').rows]"
tar -C "$LOOP" -cJf "$OUT/loop.tar.xz" .
