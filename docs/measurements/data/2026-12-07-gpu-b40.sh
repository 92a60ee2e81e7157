#!/usr/bin/env bash
# Issue 67's GPU rows on flash-attn-4 4.0.0b40 (SM120 kernels emulated at SM120's CTAs per SM), one call each:
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh main    # the main job on the short suite (experiment.py through prepare.py)
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh sg      # bench/table_vs_upstream.py, standard + generalization + chunked, 2 runs
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh models  # the same on the models suite
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh sg-run2 # run 2 alone (upstream first), when run 1 came from an
#        # earlier call (2026-12-07 s13's, cut by the call's limit): one call each, ~8 min; then one table from both:
#        # python3 bench/table_vs_upstream.py --summarize docs/measurements/logs/2026-12-07-h100-s13-b40-sg.jsonl,table-sg-run2.jsonl
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh models-run1   # the models suite's run 1, then in the next call
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh models-run2   # its run 2 (--summarize table-models-run1.jsonl,...-run2.jsonl)
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh guards  # issue 66: the planted cheats on CUDA, each caught with its rule
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh cost    # issue 66: what the hardening adds per evaluation, this tree and
#                                                             # .before66 (7ce6f97, the b40 pin before issue 66) in one call
#   bash docs/measurements/data/2026-12-07-gpu-b40.sh honest  # issue 66: the main job on the short suite, before and after, twice
# Several names in one call run in order. Logs go to $OUT (or ./out).
set -u
OUT=$(realpath -m "${OUT:-out}"); mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 FA4TUNE_RESULTS_TSV=$OUT/results.tsv PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'))"; } | tee -a "$OUT/device.txt"
for step in "$@"; do
  case "$step" in
    main)
      timeout 300 python3 experiment.py --suite short 2>&1 | tee "$OUT/main.log" | tail -30 ;;
    sg)
      timeout ${TABLE_TIMEOUT:-560} python3 bench/table_vs_upstream.py --suites standard,generalization,chunked --runs 2 \
        --out "$OUT/table-sg.jsonl" 2>&1 | tee "$OUT/table-sg.log" | tail -60 ;;
    sg-run2|models-run1|models-run2)
      suites=$([ "${step%%-*}" = sg ] && echo standard,generalization,chunked || echo models); run=${step##*-run}
      timeout ${TABLE_TIMEOUT:-570} python3 bench/table_vs_upstream.py --suites $suites --runs 1 --first-run $run \
        --out "$OUT/table-$step.jsonl" 2>&1 | tee "$OUT/table-$step.log" | tail -30 ;;
    models)
      timeout ${TABLE_TIMEOUT:-560} python3 bench/table_vs_upstream.py --suites models --runs 2 \
        --out "$OUT/table-models.jsonl" 2>&1 | tee "$OUT/table-models.log" | tail -60 ;;
    guards)
      timeout 300 python3 bench/guards_gpu.py 2>&1 | tee "$OUT/guards.log" | tail -40 ;;
    cost)
      for tree in . .before66 . .before66; do
        echo "== $tree"; (cd $tree && timeout 200 python3 bench/harness_cost.py --repeats 3)
      done 2>&1 | tee "$OUT/cost.log" ;;
    honest)  # HONEST_SUITE=standard HONEST_TREES=".before66 ." (one pair, ~9 min): what issue 66 asks; default: the short suite twice
      for tree in ${HONEST_TREES:-.before66 . .before66 .}; do
        name=$([ $tree = . ] && echo after || echo before)
        echo "== $name"; (cd $tree && FA4TUNE_RESULTS_TSV=$OUT/honest-$name.tsv timeout ${HONEST_TIMEOUT:-270} \
          python3 experiment.py --suite ${HONEST_SUITE:-short} --description "issue 66 honest $name" | grep -E "^experiment|tflops|configs_ok|spread")
      done 2>&1 | tee "$OUT/honest.log" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
