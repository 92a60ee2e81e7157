#!/usr/bin/env bash
# The shipped dispatch table's GPU runs (issue: the shipped table), one part per device call:
#   bash bench/gpu_table_runs.sh compare   # the table vs upstream's defaults, standard + generalization suites, 2 runs
#   bash bench/gpu_table_runs.sh confirm   # resume the first standard-suite study (its unconfirmed winners), then report
#   bash bench/gpu_table_runs.sh chunked   # forward studies of the chunked classes (suites/chunked.json) into $STORE
#   APPLY=$STORE bash bench/gpu_table_runs.sh compare   # compare after `search apply` of that storage's winners
# $STORE (default /opt/fa4tune-chunked.db) lives outside $OUT so that the next call on the warm machine finds it.
# On a GPU that is not SM120 the SM120 kernels run emulated (label the figures so). Logs and files go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f /opt/devsite/env.sh ] && . /opt/devsite/env.sh
export PYTHONUNBUFFERED=1 FA4TUNE_RESULTS_TSV="$OUT/results.tsv"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
case "${1:?compare or confirm}" in
  compare)
    if [ -n "${APPLY:-}" ]; then
      python3 -m search apply --storage "sqlite:///$APPLY" 2>&1 | grep -v Warning | tee "$OUT/apply.log" | tail -12
      cp experiment.py "$OUT/experiment.applied.py"
    fi
    start=$(date +%s)
    timeout "${LIMIT:-560}" python3 bench/table_vs_upstream.py --suites "${SUITES:-standard,generalization}" --runs 2 \
      --out "$OUT/table_vs_upstream.jsonl" 2>&1 | grep -v Warning > "$OUT/table_vs_upstream.log"
    echo "table_vs_upstream: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$OUT/table_vs_upstream.log"
    grep -v "^run " "$OUT/table_vs_upstream.log" | tail -80 ;;
  chunked)
    store=${STORE:-/opt/fa4tune-chunked.db}
    start=$(date +%s)
    timeout "${LIMIT:-500}" python3 -m search run --suite chunked --direction fwd --n-trials "${N_TRIALS:-16}" --proposer none \
      --storage "sqlite:///$store" --results "$OUT/results.tsv" > "$OUT/chunked.log" 2>&1
    echo "search run (chunked): exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/chunked.log"
    python3 -m search report --storage "sqlite:///$store" > "$OUT/chunked-report.log" 2>&1
    xz -6 -c "$store" > "$OUT/chunked-study.db.xz"
    grep -v Warning "$OUT/chunked.log" | grep -v "^\[" | tail -12; grep -v Warning "$OUT/chunked-report.log" | tail -40 ;;
  confirm)
    db="$OUT/standard-study.db"
    xz -dc docs/measurements/data/2026-12-01-standard-study.db.xz > "$db"
    start=$(date +%s)
    # that study was measured at the H200's own CTAs per SM (before the padding): continue it as it was measured
    FA4TUNE_EMULATE_OCCUPANCY=0 timeout "${LIMIT:-300}" python3 -m search run --proposer none --storage "sqlite:///$db" --results "$OUT/results.tsv" > "$OUT/confirm.log" 2>&1
    echo "search run (resume): exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/confirm.log"
    python3 -m search report --storage "sqlite:///$db" > "$OUT/confirm-report.log" 2>&1
    xz -6 -f "$db"
    grep -v Warning "$OUT/confirm.log" | tail -25; grep -v Warning "$OUT/confirm-report.log" | tail -40 ;;
esac
