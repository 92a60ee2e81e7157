#!/usr/bin/env bash
# The GPU rows of docs/gpu-runs.md that issues #42, #43 and #44 owe, in calls that fit the device's 10 minutes:
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh fix      # #42: upstream varlen GQA dK/dV fix, its test pristine vs patched
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh ncu      # #42: fp16 vs bf16 on the longest-first TMA class, Nsight pair
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh varlen   # #42: the six packed batches under the varlen rule
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh skv      # #43: the series' split-KV test file alone, faults named (carry .upstream-tests)
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh skvasync # #43: the same without CUDA_LAUNCH_BLOCKING (does the fault need async launches?)
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh decode   # #43: the decode table for the split-KV PR text (vs upstream, SDPA)
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh ut0      # #43: upstream's tests, pristine (carry .upstream-tests; copy
#                                                   $OUT/ut/* back to .upstream-tests/runs/ after each call); ut3, ut1, ut2: the series' patches
#   ... bwdcta      # #44: the backward's fixed cost a CTA (prologue, epilogue) against its cost a tile pair, causal and not
#   ... bwdcalls    # #44: the standard d128 problems' backward calls kernel by kernel (outside the main kernel), 1 min
#   ... utpar       # #43: on an nvidia-h100-x8 (or x4): the series' variants 1-3 and the series + the varlen GQA fix at once
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh varlensuite # #42: the varlen suite through prepare.py, then its baselines
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh fp16twins   # #42: the fp16 models rows' entry against its TMA twins
#   bash docs/measurements/data/2026-12-05-gpu-issues-42-45.sh twins  # #44 (alias headsfirst): the backward twin class (the diagonal-only mask)
#                                                   vs the table's coordinate-mask entries and upstream, the causal problems
#   ... table44     # #44: bench/table_vs_upstream.py, the standard suite's backward steps (ONLY= to split), 2 runs, FA2 beside
#   ... ncubwd      # #44: Nsight Compute on the table's d128 backward entries (causal: the 8-warp class), the profile after
#   ... fp8check    # #45: the FP8 forward prototype against the fp32 reference on dequantized inputs
#   ... fp8std      # #45: the FP8 prototype gated on the standard prefill shapes (3 input kinds, K smoothed), timed
#   ... fp8pv       # #45: fp8probe then fp8time in one call (about 7 min; split them after the installs' call)
#   ... fp8probe    # #45: the fused quantization's GPU test, then the P V probe (exits nonzero on a mismatch)
#   ... fp8time     # #45: P V on e4m3 (pv_fp8) against the default, gated, timed against the bf16 table (FP8_CONFIGS)
#   ... studies44   # #44: the causal backward studies (GQA 4, d96, d64; 30 trials each, STUDY_TIMEOUT s each), then report
#   ... studiesedge # #44: the non-causal backward studies drawing sm120_edge (d128, d96, d64; EDGE_CLASSES=, STUDY_TIMEOUT=)
#   ... vregs       # #44: the V-in-registers patch applied, its configs upstream refuses on d128 non-causal (128 and 256
#                     threads), VREGS_BUDGET s (default 300), the best 12 printed; the patch taken off again
#   ... s9twins     # #44: the non-causal entries against session 9's study winners and the V-in-registers best (patch on)
#   ... fp16gqa4    # #42: the models table's fp16 rows before and after applying the fp16 GQA 4 study's winner
#   ... fp8class    # #45: the registered FP8 class (kernels/fp8_forward_sm120.py) through bench/fp8_forward.py: three
#                     tilings gated under the FP8 gate on the standard prefill shapes, timed against the bf16 table
# Several names in one call run in order. Logs go to $OUT (or ./out). SM120 kernels emulated at SM120's CTAs per SM.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 FA4TUNE_RESULTS_TSV=$OUT/results.tsv
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee -a "$OUT/device.txt"
for step in "$@"; do
  case "$step" in
    fix)
      timeout 240 python3 bench/upstream_tests.py --tests .upstream-tests/tests/cute --work /tmp/ut-work \
        --series "$PWD/docs/measurements/data/2026-12-05-upstream-fix-" -k varlen_gqa_bwd --workers 8 --out "$OUT/fix" \
        > "$OUT/fix.log" 2>&1; echo "fix rc $?"; tail -30 "$OUT/fix.log" ;;
    ncu)
      for dt in fp16 bf16; do
        timeout 100 "$NCU" --clock-control none -k regex:ForwardSm120 --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
          --section LaunchStats --section Occupancy python3 bench/gpu_ncu.py --suite models \
          --only "llama3-8b prefill 4k $dt" --config dispatch > "$OUT/ncu-$dt.log" 2>&1
        echo "ncu $dt rc $?"; grep -m1 -o "tensorptr[a-z0-9]*gmem" "$OUT/ncu-$dt.log"  # the inputs' dtype as compiled
        grep -E "Duration|Throughput|Registers|Stall|Issued Ipc|Warp Cycles|Achieved Occ|Executed Ipc|Block Size|Grid Size|Dynamic Shared|Bank" "$OUT/ncu-$dt.log" | head -40
      done ;;
    skv)
      CUDA_LAUNCH_BLOCKING=1 timeout 500 python3 bench/upstream_tests.py --tests .upstream-tests/tests/cute --work /tmp/ut-work --variants 3 \
        -k sm120_splitkv --workers 8 --timeout 480 --out "$OUT/skv" > "$OUT/skv.log" 2>&1; echo "skv rc $?"; tail -40 "$OUT/skv.log"
      grep -m3 -B30 "misaligned" "$OUT"/skv/p0001-0002-0003.rerun.log 2>/dev/null | tail -60 ;;
    skvasync)
      timeout 500 python3 bench/upstream_tests.py --tests .upstream-tests/tests/cute --work /tmp/ut-work --variants 3 \
        -k sm120_splitkv --workers 8 --timeout 480 --out "$OUT/skv-async" > "$OUT/skv-async.log" 2>&1; echo "skvasync rc $?"
      tail -40 "$OUT/skv-async.log"; grep -m3 -B30 "misaligned" "$OUT"/skv-async/*.log 2>/dev/null | tail -60 ;;
    decode)
      timeout 400 python3 bench/gpu_splitkv.py --part timing --out "$OUT/decode-table.jsonl" > "$OUT/decode.log" 2>&1
      echo "decode rc $?"; tail -45 "$OUT/decode.log" ;;
    varlen)
      timeout 300 python3 bench/varlen.py --rounds 40 > "$OUT/varlen.log" 2>&1; echo "varlen rc $?"; tail -40 "$OUT/varlen.log" ;;
    varlensuite)
      timeout 280 python3 prepare.py --experiment experiment.py --suite varlen --description "issue 42: varlen through the harness" > "$OUT/varlensuite.log" 2>&1
      echo "varlensuite rc $?"; tail -25 "$OUT/varlensuite.log"
      timeout 280 python3 prepare.py --baseline --suite varlen > "$OUT/varlensuite-baseline.log" 2>&1
      echo "varlensuite baseline rc $?"; tail -30 "$OUT/varlensuite-baseline.log" ;;
    fp16twins)
      timeout 420 python3 bench/gpu_twins.py --part timing --suites models --only fp16 --runs 2 > "$OUT/fp16twins.log" 2>&1
      echo "fp16twins rc $?"; tail -40 "$OUT/fp16twins.log" ;;
    twins|headsfirst)
      timeout 540 python3 docs/measurements/data/2026-12-05-heads-first-backward.py --suites ${SUITES:-standard} \
        --only "${ONLY:-causal,gqa prefill 2k,gqa prefill 8k}" > "$OUT/headsfirst.log" 2>&1
      echo "headsfirst rc $?"; tail -40 "$OUT/headsfirst.log" ;;
    s9twins)  # #44 session 9: the non-causal entries against the studies' winners and the V-in-registers best, patch on
      git apply docs/measurements/data/2026-12-06-vregs-backward.patch && echo "vregs patch applied"
      timeout ${TWINS_TIMEOUT:-300} python3 docs/measurements/data/2026-12-05-heads-first-backward.py --suites standard,generalization \
        --only "${ONLY:-b2 s4096 h16 d128\$,b2 s4096 h16 d96\$,b4 s2048 h32 d64\$,b4 s2048 h16 d128\$,b1 s3000 h24 d128\$,b4 s1537 h16 d96\$,b8 s1024 h32 d64\$}" > "$OUT/s9twins.log" 2>&1; echo "s9twins rc $?"
      git apply -R docs/measurements/data/2026-12-06-vregs-backward.patch && echo "vregs patch off"; tail -20 "$OUT/s9twins.log" ;;
    table44)
      timeout ${TABLE_TIMEOUT:-540} python3 bench/table_vs_upstream.py --suites ${SUITES:-standard} --runs 2 --fa2 --direction bwd --only "${ONLY:-}" --out "$OUT/table44.jsonl" \
        > "$OUT/table44.log" 2>&1; echo "table44 rc $?"; grep -v -e Warning -e generate_mlir "$OUT/table44.log" | tail -60 ;;
    ncubwd)
      for only in "b1 s8192 h16 d128 causal" "b1 s8192 h16 d128"; do
        timeout 120 "$NCU" --clock-control none -k regex:BackwardSm120 --launch-skip 1 --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
          python3 bench/gpu_ncu.py --suite standard --only "$only" --direction bwd --config dispatch > "$OUT/ncubwd-${only// /_}.log" 2>&1
        echo "ncubwd $only rc $?"; grep -E "Duration|Throughput|Registers|Stall|Warp Cycles|Achieved Occ|Block Size|Local|Hit Rate" "$OUT/ncubwd-${only// /_}.log" | head -30
      done ;;
    fp8check)
      timeout ${FP8_TIMEOUT:-300} python3 docs/measurements/data/2026-12-06-fp8/gpu_check.py > "$OUT/fp8check.log" 2>&1
      echo "fp8check rc $?"; grep -v -e Warning -e generate_mlir "$OUT/fp8check.log" | tail -40 ;;
    fp8std)
      timeout ${FP8_TIMEOUT:-420} python3 docs/measurements/data/2026-12-06-fp8/gpu_standard.py > "$OUT/fp8std.log" 2>&1
      echo "fp8std rc $?"; grep -v -e Warning -e generate_mlir "$OUT/fp8std.log" | tail -50
      timeout 90 python3 bench/mma_rate.py > "$OUT/mma_rate.log" 2>&1; echo "mma_rate rc $?"; tail -15 "$OUT/mma_rate.log" ;;
    studies44)
      for pc in d128-causal-gqa4-bf16 d96-causal-bf16 d64-causal-bf16; do
        timeout ${STUDY_TIMEOUT:-170} python3 -m search run --suite standard --problem-class $pc --direction bwd --n-trials 30 \
          --storage sqlite:///$OUT/bwd-cmask.db > "$OUT/study-$pc.log" 2>&1; echo "study $pc rc $?"
      done
      python3 -m search report --storage sqlite:///$OUT/bwd-cmask.db 2>&1 | tail -40 ;;
    studiesedge)  # the non-causal backward classes with sm120_edge drawn (new storage: the space gained `kernel`)
      for pc in ${EDGE_CLASSES:-d128-noncausal-bf16 d96-noncausal-bf16 d64-noncausal-bf16}; do
        timeout ${STUDY_TIMEOUT:-175} python3 -m search run --suite standard --problem-class $pc --direction bwd --n-trials 30 \
          --storage sqlite:///$OUT/bwd-edge.db > "$OUT/study-$pc.log" 2>&1; echo "study $pc rc $?"
      done
      python3 -m search report --storage sqlite:///$OUT/bwd-edge.db 2>&1 | tail -40 ;;
    vregs)  # patch on, sweep, patch off: the tree is as it came whatever the sweep does
      git apply docs/measurements/data/2026-12-06-vregs-backward.patch && echo "vregs patch applied"
      timeout $(( ${VREGS_BUDGET:-300} + 60 )) python3 bench/bwd_sweep.py --out "$OUT/vregs" --kernel sm120_vregs --opened \
        --classes d128-noncausal-bf16 --time-budget ${VREGS_BUDGET:-300} > "$OUT/vregs.log" 2>&1; echo "vregs rc $?"
      git apply -R docs/measurements/data/2026-12-06-vregs-backward.patch && echo "vregs patch off"
      grep -E "^ *[0-9]+ +[0-9]+s " "$OUT/vregs.log" | awk '{print $5, $0}' | sort -rn | head -12 | cut -d' ' -f2-
      grep -cE " ok " "$OUT/vregs.log"; grep -E "configs to measure|^done" "$OUT/vregs.log" ;;
    fp16gqa4)
      timeout 200 python3 bench/table_vs_upstream.py --suites models --only fp16 --runs 2 --out "$OUT/fp16-before.jsonl" \
        > "$OUT/fp16-before.log" 2>&1; echo "before rc $?"; grep -E "^models|geomean" "$OUT/fp16-before.log"
      cp experiment.py /tmp/experiment.py.orig
      xz -dc docs/measurements/data/2026-12-06-h100-models-gqa4-fp16.db.xz > /tmp/fp16.db
      python3 -m search apply --storage sqlite:////tmp/fp16.db > "$OUT/fp16-apply.log" 2>&1; echo "apply rc $?"
      timeout 200 python3 bench/table_vs_upstream.py --suites models --only fp16 --runs 2 --out "$OUT/fp16-after.jsonl" \
        > "$OUT/fp16-after.log" 2>&1; echo "after rc $?"; grep -E "^models|geomean" "$OUT/fp16-after.log"
      cp /tmp/experiment.py.orig experiment.py ;;
    fp8class)
      timeout 560 python3 bench/fp8_forward.py --configs default,64x64s1,64x64s2 > "$OUT/fp8class.log" 2>&1
      echo "fp8class rc $?"; grep -E "^\| .*(FAIL|refused)|pass the FP8|^\| .*x \|$|emulated" "$OUT/fp8class.log" ;;
    fp8pv)
      # both halves below in one call (about 7 min)
      OUT="$OUT" bash "$0" fp8probe fp8time ;;
    fp8probe)
      # the fused quantization's GPU test (e4m3 bytes against torch's), then P V on e4m3 against the default, gated
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_quant.py > "$OUT/fp8quant.log" 2>&1
      echo "fp8quant rc $?"; tail -3 "$OUT/fp8quant.log"
      # P V's pairing of P and V^T on structured inputs (one-hot P, uniform P, random), the fused V^T's bytes
      timeout 200 python3 docs/measurements/data/2026-12-06-fp8-pv-probe.py > "$OUT/fp8pvprobe.log" 2>&1
      echo "fp8pvprobe rc $?"; tail -30 "$OUT/fp8pvprobe.log" ;;
    fp8time)
      timeout 440 python3 bench/fp8_forward.py --configs "${FP8_CONFIGS:-default,64x64s2p,64x128s2p}" > "$OUT/fp8pv.log" 2>&1
      echo "fp8pv rc $?"; grep -E "^\| .*(FAIL|refused)|pass the FP8|^\| .*x \|$|emulated" "$OUT/fp8pv.log" ;;
    ut0|ut1|ut2|ut3)
      # one variant a call (0 pristine, n: the series' first n patches), 8 workers, the kernel cache shared; a variant
      # cut off at the call's limit continues with the same step next call (--resume on the reports carried back in
      # .upstream-tests/runs/); the patched variants compare with the pristine run's reports there
      n=${step#ut}; mkdir -p "$OUT/ut"; cp .upstream-tests/runs/* "$OUT/ut/" 2>/dev/null
      more=(--variants "$n"); [[ -f "$OUT/ut/selected.txt" ]] && more+=(--resume)
      [[ $n != 0 ]] && more+=(--baseline "$OUT/ut/pristine.jsonl")
      FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-jit \
        timeout 575 python3 bench/upstream_tests.py --tests .upstream-tests/tests/cute --work /tmp/ut-work --workers 8 \
        "${more[@]}" --timeout 545 --out "$OUT/ut" > "$OUT/$step.log" 2>&1; echo "$step rc $?"; tail -40 "$OUT/$step.log" ;;
    utpar)
      # on a machine of several GPUs: the series' variants 1-3 and 4 = the series + the separate varlen GQA dK/dV fix
      # (data/2026-12-05-upstream-fix-0001), all at once (UT_VARIANTS to choose), the GPUs shared out among them (on 8
      # GPUs two a variant, 8 workers a GPU: UT_WORKERS), against the pristine reports in .upstream-tests/runs/; each
      # variant has its own packages; --resume as for utN. No persistent kernel cache: it showed no clear gain, and a
      # clear() in one worker (upstream's retry_on_oom calls it) deletes the files the others load
      mkdir -p "$OUT/ut" /tmp/series4; cp .upstream-tests/runs/* "$OUT/ut/" 2>/dev/null
      for f in docs/measurements/data/2026-12-06-upstream-series-000[123]-*.patch; do cp "$f" "/tmp/series4/s-${f#*series-}"; done
      cp docs/measurements/data/2026-12-05-upstream-fix-0001-varlen-gqa-dkv-offset.patch /tmp/series4/s-0004-varlen-gqa-dkv-offset.patch
      variants=(${UT_VARIANTS:-1 2 3 4}); gpus=$(nvidia-smi -L | wc -l)
      per=$((gpus / ${#variants[@]})); ((per < 1)) && per=1; i=0
      for n in "${variants[@]}"; do
        list=$(for ((g = 0; g < per; g++)); do echo $(((i * per + g) % gpus)); done | paste -sd,)
        more=(--variants "$n" --baseline "$OUT/ut/pristine.jsonl" --series /tmp/series4/s- --gpus "$list")
        [[ -f "$OUT/ut/selected.txt" ]] && more+=(--resume)
        timeout $((${UT_TIMEOUT:-545} + 30)) python3 bench/upstream_tests.py --tests .upstream-tests/tests/cute --work "/tmp/ut-work-$n" \
          --workers "${UT_WORKERS:-$((8 * per))}" "${more[@]}" --timeout "${UT_TIMEOUT:-545}" --out "$OUT/ut" > "$OUT/ut$n.log" 2>&1 &
        echo "ut$n on GPUs $list"; i=$((i + 1))
      done
      wait
      for n in "${variants[@]}"; do echo "== ut$n"; grep -v "^  " "$OUT/ut$n.log" | tail -14; done ;;
    bwdcalls)
      # each standard d128 problem's backward call kernel by kernel (what lies outside the main kernel), table and upstream
      timeout 300 python3 docs/measurements/data/2026-12-06-bwd-cta-cost-probe.py --calls > "$OUT/bwdcalls.log" 2>&1
      echo "bwdcalls rc $?"; grep -Ev "main [0-9.]+ us$|UserWarning|exe_args" "$OUT/bwdcalls.log" | tail -24 ;;
    bwdcta)
      # what a backward CTA pays once (prologue, epilogue), fixed CTAs and growing pairs, causal and not, table vs upstream
      timeout 560 python3 docs/measurements/data/2026-12-06-bwd-cta-cost-probe.py > "$OUT/bwdcta.log" 2>&1
      echo "bwdcta rc $?"; grep -Ev "^(causal|non-causal) [a-z]+ s[0-9]+:" "$OUT/bwdcta.log" | tail -30 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
