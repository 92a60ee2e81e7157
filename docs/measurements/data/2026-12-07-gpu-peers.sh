#!/usr/bin/env bash
# Issue 68 (the peers): the shipped table against upstream's defaults, upstream's autotuner (its own candidates and our
# feasible space handed to it), pull request #2634 (dispatch, unpacked GQA, decode kernel), #2771's backward configs
# through our classes and torch SDPA (FA2), gated and timed in one interleaved step per problem (bench/peers.py).
# SM120 kernels emulated at SM120's CTAs per SM (ours and the peers'); SDPA's FA2 runs natively, not held to 99 KB.
#
# carry: .peers  (gitignored, 2.8 MB: `python3 bench/peer_sources.py assemble --git <clone of Dao-AILab/flash-attention
#        with refs/pull/2634/head and refs/pull/2771/head>`; each step checks it against bench/peers_manifest.json first)
#
#   bash docs/measurements/data/2026-12-07-gpu-peers.sh smoke          # quick suite, every peer: the chain works (~4 min)
#   bash docs/measurements/data/2026-12-07-gpu-peers.sh std-fwd-1 std-fwd-2 std-bwd      # standard (~5, 5, 6 min)
#   bash docs/measurements/data/2026-12-07-gpu-peers.sh gen-fwd-1 gen-fwd-2 gen-bwd-1 gen-bwd-2  # generalization (~5 each)
#   bash docs/measurements/data/2026-12-07-gpu-peers.sh models-fwd-1 ... models-fwd-6    # models forward, 6 parts (~7 each)
#   bash docs/measurements/data/2026-12-07-gpu-peers.sh models-bwd decode                # (~5, ~4 min)
#   bash docs/measurements/data/2026-12-07-gpu-peers.sh summary        # every step's records in one summary (seconds)
#
#   GPUS=0,1,2,3,4,5,6,7 bash docs/measurements/data/2026-12-07-gpu-peers.sh std-fwd-1 ... decode  # several GPUs of one
#        host (nvidia-h100-x8 or the like): the named steps in parallel, GPU i taking steps i, i+n, ... in order, each
#        step's compiles on the host's cores / n - 1 processes; every step is timed on one GPU, so its ratios hold.
#        Over 8 files: give OUT a folder outside $OUT and tar it into $OUT at the end of the call
#
# One step per call (each fits a 10-minute call; several names run in order). The minutes are estimates, not
# measurements: ~9 s a problem for the table and upstream (the lead's figure) plus ~3 s per further candidate, ~5-10 s
# of autotuner tuning per forward problem (its 5 rounds x 31 CUDA-graph replays per candidate, 2-4 own and ~13 of ours),
# and 1-2 min of compiling ahead (ours, then the peers' on 15 CPU processes). A step cut off by its limit keeps what it
# measured (JSON lines, written as measured) and `RESUME=1` runs only its steps not yet recorded. Logs and JSON lines go
# to $OUT (or ./out); each step prints its table and summary, `summary` all of them together.
set -u
OUT=$(realpath -m "${OUT:-out}"); mkdir -p "$OUT"
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git log -1 --format=%h 2>/dev/null
  python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'), 'torch', m.version('torch'))"; } | tee -a "$OUT/device.txt"
python3 bench/peer_sources.py check || exit 2
peers() {  # name, then bench/peers.py arguments
  local name=$1; shift
  timeout ${STEP_TIMEOUT:-560} python3 bench/peers.py "$@" --out "$OUT/peers-$name.jsonl" ${RESUME:+--resume} \
    ${COMPILE_JOBS:+--compile-jobs $COMPILE_JOBS} 2>&1 \
    | tee -a "$OUT/peers-$name.log" | tail -80
}
if [[ -n "${GPUS:-}" ]]; then  # one queue of steps per GPU, the queues in parallel; each step's output in its log
  IFS=, read -ra gpus <<< "$GPUS"; n=${#gpus[@]}; steps=("$@")
  for step in "${steps[@]}"; do [[ $step == summary ]] && { echo "GPUS: run summary after the steps, alone" >&2; exit 2; }; done
  export COMPILE_JOBS=$(( $(nproc) / n > 1 ? $(nproc) / n - 1 : 1 ))
  for i in "${!gpus[@]}"; do
    mine=(); for ((j = i; j < ${#steps[@]}; j += n)); do mine+=("${steps[j]}"); done
    [[ ${#mine[@]} -gt 0 ]] || continue
    (export CUDA_VISIBLE_DEVICES=${gpus[i]}; GPUS= bash "$0" "${mine[@]}" > "$OUT/gpu${gpus[i]}.out" 2>&1) &
  done
  wait
  for f in "$OUT"/gpu*.out; do echo "== $f"; tail -n 12 "$f"; done; exit 0
fi
for step in "$@"; do
  case "$step" in
    smoke) peers smoke --suites quick ;;
    std-fwd-[12]) peers "$step" --suites standard --direction fwd --part "${step##*-}/2" ;;
    std-bwd) peers "$step" --suites standard --direction bwd ;;
    gen-fwd-[12]) peers "$step" --suites generalization --direction fwd --part "${step##*-}/2" ;;
    gen-bwd-[12]) peers "$step" --suites generalization --direction bwd --part "${step##*-}/2" ;;
    models-fwd-[1-6]) peers "$step" --suites models --direction fwd --part "${step##*-}/6" ;;
    models-bwd) peers "$step" --suites models --direction bwd ;;
    decode) peers "$step" --suites decode ;;
    summary)
      cat "$OUT"/peers-{std,gen,models,decode}*.jsonl > "$OUT/peers-all.jsonl" 2>/dev/null
      python3 bench/peers.py --summarize "$OUT/peers-all.jsonl" 2>&1 | tee "$OUT/peers-summary.log" | tail -80 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
