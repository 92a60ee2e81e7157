#!/usr/bin/env bash
# Issue 67's GPU rows on flash-attn-4 4.0.0b40 (SM120 kernels emulated at SM120's CTAs per SM), one call each:
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh main    # the main job on the short suite (experiment.py through prepare.py)
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh sg      # bench/table_vs_upstream.py, standard + generalization, 2 runs
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh models  # the same on the models suite
# Several names in one call run in order. Logs go to $OUT (or ./out).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 FA4TUNE_RESULTS_TSV=$OUT/results.tsv
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'))"; } | tee -a "$OUT/device.txt"
for step in "$@"; do
  case "$step" in
    main)
      timeout 300 python3 experiment.py --suite short 2>&1 | tee "$OUT/main.log" | tail -30 ;;
    sg)
      timeout ${TABLE_TIMEOUT:-560} python3 bench/table_vs_upstream.py --suites standard,generalization --runs 2 \
        --out "$OUT/table-sg.jsonl" 2>&1 | tee "$OUT/table-sg.log" | tail -60 ;;
    models)
      timeout ${TABLE_TIMEOUT:-560} python3 bench/table_vs_upstream.py --suites models --runs 2 \
        --out "$OUT/table-models.jsonl" 2>&1 | tee "$OUT/table-models.log" | tail -60 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
