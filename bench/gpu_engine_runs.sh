#!/usr/bin/env bash
# The evaluation engine's GPU runs (issue: timing, one GPU worker, compile-ahead by default), one part per device call:
#   bash bench/gpu_engine_runs.sh server       # seconds per config, fresh child vs step server; a real illegal-address fault
#   bash bench/gpu_engine_runs.sh throughput   # checked (config, problem) per GPU-hour: search run's default vs sequential
#                                              # (SLOTS=N: candidates in flight, for hosts with many cores)
#   bash bench/gpu_engine_runs.sh study        # a 40-trial study of d128-causal-bf16 forward with search run's defaults
# On a GPU that is not SM120 the SM120 kernels run emulated (label the figures so). Logs and files go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f /opt/devsite/env.sh ] && . /opt/devsite/env.sh
export PYTHONUNBUFFERED=1 FA4TUNE_RESULTS_TSV="$OUT/results.tsv"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
case "${1:?server, throughput or study}" in
  server)
    timeout 280 python3 bench/step_server.py --configs 2 --out "$OUT/step_server.jsonl" 2>&1 | grep -v Warning | tee "$OUT/step_server.log" ;;
  throughput)
    timeout 570 python3 bench/throughput.py --seconds 240 --sequential-seconds 150 --slots "${SLOTS:-0}" --out "$OUT/throughput.jsonl" 2>&1 | grep -v Warning | tee "$OUT/throughput.log" ;;
  study)
    start=$(date +%s)
    timeout 540 python3 -m search run --direction fwd --problem-class d128-causal-bf16 --storage "sqlite:///$OUT/search.db" \
      --results "$OUT/results.tsv" > "$OUT/study.log" 2>&1
    echo "search run: exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/study.log"
    python3 -m search report --storage "sqlite:///$OUT/search.db" 2>&1 | tee -a "$OUT/study.log"
    grep -v Warning "$OUT/study.log" | tail -70 ;;
esac
