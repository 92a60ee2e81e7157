#!/usr/bin/env bash
# Issue 69's GPU checks of the drop-in (fa4tune.dropin, fa4tune.torch_op, fa4tune.hf_attention), one call each:
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh compile  # torch.compile(fullgraph=True): no graph break, fwd+bwd == eager
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh graphs   # CUDA graphs: prefill, split-KV decode, decode with seqused_k,
#                                                                  # captured, replayed on new inputs, == eager on those inputs;
#                                                                  # the seqused_k decode also ran split-KV and == fp32 reference
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh seqused  # KV-cache decodes with seqused_k (1 key to all, num_splits=8):
#                                                                  # the split-KV class ran each (debug line), each sequence within
#                                                                  # the gate's bound of the fp32 reference on its used keys
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh window   # Mistral / Gemma 2 / Gemma 3 windows and softcap: gated vs the
#                                                                  # fp32 reference with the same window and softcap, timed vs
#                                                                  # upstream's SM120 config on our host path
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh hf       # transformers Llama (random weights) "fa4tune" vs "sdpa"
#                                                                  # (needs the extra: uv sync --frozen --extra hf)
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh local    # the TMA classes' window loop gated on 8 windows (all 4
#                                                                  # classes at d64, 2 at d128, 1 at d256 with a soft-cap);
#                                                                  # gpt-oss / Mistral sliding layers timed on upstream's SM80
#                                                                  # loop vs 3 TMA configs (~5 min, most of it compiles)
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh softcap  # Gemma 2 27B soft-cap layers: upstream, the studies' winner and
#                                                                  # configs whose occupancy sm_90a and sm_120a agree on, timed
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh window-decode  # split-KV with a window or soft-cap gated (contiguous, paged), the
#                                                                  # models' window / soft-cap decodes timed vs upstream
#   bash docs/measurements/data/2026-12-07-gpu-issue69.sh tests    # the drop-in's CPU tests on the GPU machine too
# Several names in one call run in order. Logs go to $OUT (or ./out). Each step's last line: "<step>: ok" or "N failed".
set -u
OUT=$(realpath -m "${OUT:-out}"); mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 PYTHONUNBUFFERED=1  # a crash keeps the rows printed before it
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'), 'torch', m.version('torch'))"; } | tee -a "$OUT/device.txt"
for step in "$@"; do
  case "$step" in
    compile|graphs|seqused|window|hf|local|softcap|window-decode)
      timeout ${STEP_TIMEOUT:-560} python3 bench/dropin_gpu.py "$step" 2>&1 | tee "$OUT/$step.log" | tail -40 ;;
    tests)
      timeout 300 python3 -m pytest -n 0 -q tests/test_dropin.py tests/test_window_softcap.py tests/test_hf_attention.py tests/test_bench_dropin_gpu.py \
        2>&1 | tee "$OUT/tests.log" | tail -5 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
