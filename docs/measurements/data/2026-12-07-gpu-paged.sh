#!/usr/bin/env bash
# Issue 71's GPU checks of paged KV (a page table into K/V page pools, our split-KV class sm120_splitkv), one call each:
#   bash docs/measurements/data/2026-12-07-gpu-paged.sh gate     # ~3 min: pages of 16 / 64 / 256 tokens, shuffled, sequences
#                                                                #   of different used lengths (1 key to all; d64 / d96 / d128
#                                                                #   decodes and a causal chunk of 512 over 8K slots): each
#                                                                #   sequence within the gate's rule of the fp32 reference on its
#                                                                #   gathered keys, the paged class ran (debug line), and the
#                                                                #   same decode on the contiguous cache bit-identical where the
#                                                                #   config is the same
#   bash docs/measurements/data/2026-12-07-gpu-paged.sh time     # ~2 min: Llama 3 8B decodes (b8 16K, b1 64K, b32 4K): paged 16 /
#                                                                #   64 / 256 vs the same decode on a contiguous cache (target:
#                                                                #   within 5 %) vs torch SDPA's decode, gated, then timed
#                                                                #   interleaved in one step per shape (the harness's timer)
#   bash docs/measurements/data/2026-12-07-gpu-paged.sh graphs   # ~1 min: the paged decode (pages of 16 and 256) captured in a CUDA
#                                                                #   graph, replayed on new q, pages, table and used lengths: gated
#                                                                #   against the fp32 reference, == the eager call
#   bash docs/measurements/data/2026-12-07-gpu-paged.sh harness  # ~5 min: prepare.py on the decode suite's paged rows (our table:
#                                                                #   gate with shuffled pages and ragged lengths, timed, checked)
#   bash docs/measurements/data/2026-12-07-gpu-paged.sh tests    # ~1 min: the paged CPU tests on the GPU machine too
#   AB_PATCH="<patch> ..." bash docs/measurements/data/2026-12-07-gpu-paged.sh ab  # ~6 min: `time` in this tree and in a
#                                                                #   copy per patch with its kernels/ applied (default: s18's
#                                                                #   per-page-slot row pointers, s13's page-table read ahead for
#                                                                #   pages under a tile, s17's for every page size; the read
#                                                                #   aheads lost on the H100), two rounds in one call: kernel changes
#                                                                #   against main on the same GPU (paged ratios move by GPU)
# Several names in one call run in order (gate time graphs: ~6 min). Logs go to $OUT (or ./out). Each bench step's
# last line: "<step>: ok" or "<step>: N failed". Needs nothing carried beyond the installs (../shared/device/README.md).
# Label every figure "SM120 kernels emulated on <GPU>" (FLASH_ATTENTION_ARCH=sm_120); SDPA runs the GPU's own kernels.
set -u
OUT=$(realpath -m "${OUT:-out}"); mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 FA4TUNE_RESULTS_TSV="$OUT/results.tsv" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git log --oneline -1 2>/dev/null
  python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'), 'torch', m.version('torch'))"; } | tee -a "$OUT/device.txt"
for step in "$@"; do
  case "$step" in
    gate|time|graphs)
      timeout ${STEP_TIMEOUT:-560} python3 bench/paged_gpu.py "$step" 2>&1 | tee "$OUT/paged-$step.log" | tail -40 ;;
    harness)
      timeout ${STEP_TIMEOUT:-560} python3 prepare.py --experiment experiment.py --suite decode --only paged \
        --description "issue 71: the decode suite's paged rows" 2>&1 | tee "$OUT/paged-harness.log" | tail -40 ;;
    tests)
      timeout 300 python3 -m pytest -n 0 -q -m "not compile" tests/test_paged_kv.py tests/test_bench_paged_gpu.py \
        2>&1 | tee "$OUT/paged-tests.log" | tail -5 ;;
    ab)
      trees=(.) names=(main) i=0
      for patch in ${AB_PATCH:-docs/measurements/data/2026-12-07-paged-slot-base.patch docs/measurements/data/2026-12-07-paged-prefetch.patch docs/measurements/data/2026-12-07-paged-readahead-all.patch}; do
        i=$((i + 1)); tree=.paged-ab-$i; patch=$(realpath "$patch")
        rm -rf $tree && mkdir $tree
        tar --exclude='./.paged-ab*' --exclude=./.cache --exclude=./.devbundle --exclude=./.git --exclude=./docs --exclude=./.before66 \
          --exclude=./.peers --exclude=./.upstream-tests --exclude=./.venv -cf - . | tar -xf - -C $tree
        # outside any repository (a tree inside one would skip the paths above it, silently)
        (cd $tree && GIT_CEILING_DIRECTORIES=$(realpath ..) git apply --include='kernels/*' "$patch") \
          && ! diff -rq kernels $tree/kernels >/dev/null || { echo "ab: $patch does not change kernels/ here" >&2; exit 2; }
        trees+=($tree) names+=("$(basename "$patch" .patch)")
      done
      for round in 1 2; do
        for k in "${!trees[@]}"; do
          echo "== round $round: ${names[$k]}"
          (cd ${trees[$k]} && timeout ${STEP_TIMEOUT:-200} python3 bench/paged_gpu.py time 2>&1) | tee "$OUT/paged-ab-${names[$k]}-$round.log" \
            | grep -E "^(paged|gather)[^:]*:|gate FAILED|^time:"
        done
      done 2>&1 | tee "$OUT/paged-ab.log" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
