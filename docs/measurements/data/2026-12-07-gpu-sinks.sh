#!/usr/bin/env bash
# Issue 71's GPU checks of learnable sinks and the deterministic backward (bench/sinks_gpu.py), one call each:
#   bash docs/measurements/data/2026-12-07-gpu-sinks.sh sinks        # ~4 min: forward and backward with a learnable sink
#        # (gpt-oss full and sliding-window layers, a packed batch, a split-KV decode, d128 GQA 4 causal, d128 non-causal)
#        # gated against the fp32 reference with the sink (out, LSE, dq, dk, dv, d(sink)); each timed against the same
#        # call without a sink in one interleaved step (20 shuffled rounds, L2 flushed, behind a blocking kernel)
#   bash docs/measurements/data/2026-12-07-gpu-sinks.sh determinism  # ~4 min: deterministic=True's backward 5 times on
#        # the same inputs (bit-identical dq/dk/dv/d(sink) asserted, gated), the default backward's 5 runs counted
#        # (they may differ), the two timed against each other, interleaved
#   bash docs/measurements/data/2026-12-07-gpu-sinks.sh tests        # ~1 min: the CPU tests of issue 71 on the GPU machine
# Several names in one call run in order (all three: ~9 min). Logs go to $OUT (or ./out); each step ends with a table
# and "<step>: ok" or "<step>: N failed". No carry paths beyond the bundle (/work/shared/device/README.md).
set -u
OUT=$(realpath -m "${OUT:-out}"); mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'), 'torch', m.version('torch'))"; } | tee -a "$OUT/device.txt"
for step in "$@"; do
  case "$step" in
    sinks|determinism)
      timeout ${STEP_TIMEOUT:-560} python3 bench/sinks_gpu.py "$step" 2>&1 | tee "$OUT/$step.log" | tail -30 ;;
    tests)
      timeout 300 python3 -m pytest -n 0 -q -m "not compile" tests/test_learnable_sink.py tests/test_bench_sinks_gpu.py \
        2>&1 | tee "$OUT/tests.log" | tail -5 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
