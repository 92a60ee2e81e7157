#!/usr/bin/env bash
# The GPU runs that issues #40 and #41 owe (docs/gpu-runs.md), in calls that fit the device's 10 minutes:
#   bash docs/measurements/data/2026-12-05-gpu-issues-40-41.sh guards   # #41: planted cheats on CUDA, the short suite gated
#   bash docs/measurements/data/2026-12-05-gpu-issues-40-41.sh table    # #40: the table after the lean-house move
#   bash docs/measurements/data/2026-12-05-gpu-issues-40-41.sh cost     # #41: what the timed-output check costs
#   bash docs/measurements/data/2026-12-05-gpu-issues-40-41.sh models   # #42: the models suite, fallback classes, vs upstream
#   bash docs/measurements/data/2026-12-05-gpu-issues-40-41.sh wide     # #42: head dims past 128, gated and timed, vs upstream
#   bash docs/measurements/data/2026-12-05-gpu-issues-40-41.sh varlen   # #42: packed batches gated per sequence, vs padded
# Logs go to $OUT (or ./out). SM120 kernels emulated on the GPU at SM120's CTAs per SM.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 FA4TUNE_RESULTS_TSV=$OUT/results.tsv
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git log --oneline -1 2>/dev/null; } | tee -a "$OUT/device.txt"
case "${1:?guards, table, cost, models, wide or varlen}" in
  guards)
    timeout 150 python3 bench/guards_gpu.py > "$OUT/guards.log" 2>&1; echo "guards_gpu rc $?"; tail -25 "$OUT/guards.log"
    timeout 330 python3 prepare.py --experiment experiment.py --suite short --description "issue 41: timed outputs checked" \
      > "$OUT/prepare-short.log" 2>&1; echo "prepare rc $?"; tail -40 "$OUT/prepare-short.log" ;;
  table)
    timeout 540 python3 bench/table_vs_upstream.py --suites standard --runs 2 --out "$OUT/table-lean.jsonl" \
      > "$OUT/table-lean.log" 2>&1; echo "table rc $?"; tail -50 "$OUT/table-lean.log" ;;
  cost)
    timeout 300 python3 bench/throughput.py --suite short --seconds 90 --modes default > "$OUT/throughput.log" 2>&1
    echo "throughput rc $?"; tail -30 "$OUT/throughput.log" ;;
  models)
    timeout 560 python3 bench/table_vs_upstream.py --suites models --runs 2 --out "$OUT/table-models.jsonl" \
      > "$OUT/table-models.log" 2>&1; echo "models rc $?"; tail -80 "$OUT/table-models.log" ;;
  varlen)
    timeout 540 python3 bench/varlen.py --rounds 20 > "$OUT/varlen.log" 2>&1; echo "varlen rc $?"; tail -40 "$OUT/varlen.log" ;;
  wide)
    timeout 270 python3 prepare.py --experiment experiment.py --suite wide --description "issue 42: head dims past 128" \
      > "$OUT/prepare-wide.log" 2>&1; echo "prepare wide rc $?"; tail -30 "$OUT/prepare-wide.log"
    timeout 270 python3 bench/table_vs_upstream.py --suites wide --runs 2 --out "$OUT/table-wide.jsonl" \
      > "$OUT/table-wide.log" 2>&1; echo "table wide rc $?"; tail -25 "$OUT/table-wide.log" ;;
esac
