#!/usr/bin/env bash
# Several workers on one study on one GPU machine (issue: one study on two GPUs), one device call:
#   bash bench/gpu_workers_runs.sh [GPUS]   # GPUS: CUDA_VISIBLE_DEVICES names, comma-separated (default 0,1 or 0,0 on one GPU)
# Creates one study (d128-causal-bf16 forward, N_TRIALS trials) on SQLite (one host: the storage the design recommends),
# starts one worker per entry of GPUS with the machine's compile processes split between them, SIGKILLs the second
# worker (its process group: the GPU child too) KILL_AFTER seconds in (0: no kill), restarts it, waits for both, then counts
# duplicates and lost trials (bench/workers_check.py) and prints `search report`. Logs and files go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f /opt/devsite/env.sh ] && . /opt/devsite/env.sh
export PYTHONUNBUFFERED=1
ngpu=$(nvidia-smi -L | wc -l)
GPUS=${1:-$([ "$ngpu" -ge 2 ] && echo 0,1 || echo 0,0)}
IFS=, read -r -a gpus <<< "$GPUS"
jobs=$(( ($(nproc) - 1) / ${#gpus[@]} ))
url="sqlite:///$OUT/workers.db"
EXTRA=${EXTRA:-}  # e.g. "--evaluator replay --table search/data/h200_sweep.json" for a run without a GPU (run and workers)
nvidia-smi --query-gpu=index,name --format=csv,noheader
echo "workers on GPUs ${GPUS} (${ngpu} GPU(s) on this host), ${jobs} compile processes each"
start=$(date +%s)
python3 -m search run --workers 0 --direction fwd --problem-class d128-causal-bf16 --n-trials "${N_TRIALS:-30}" \
  --proposer none --storage "$url" $EXTRA 2>&1 | grep -v Warning | tail -3
worker() {  # name gpu: starts it in a session of its own (its pid is its process group), appends its pid to pids
  setsid python3 -m search worker --storage "$url" --gpu "$2" --compile-jobs "$jobs" --heartbeat 5 --grace 20 \
    --worker-id "$1" --results "$OUT/results-$1.tsv" $EXTRA > "$OUT/$1.log" 2>&1 &
  pids+=($!)
}
pids=()
for i in "${!gpus[@]}"; do worker "w$i" "${gpus[$i]}"; done
if [ "${KILL_AFTER:-60}" != 0 ]; then  # KILL_AFTER=0: no kill (a throughput run)
  sleep "${KILL_AFTER:-60}"
  victim=${pids[${#pids[@]}-1]}
  echo "SIGKILL worker w$(( ${#gpus[@]} - 1 )) (pid $victim and its process group) at $(( $(date +%s) - start )) s"
  kill -9 -- "-$victim"
  sleep 2
  unset "pids[${#pids[@]}-1]"
  worker "w$(( ${#gpus[@]} - 1 ))-restarted" "${gpus[${#gpus[@]}-1]}"
fi
for p in "${pids[@]}"; do wait "$p"; echo "worker pid $p: exit $?"; done
echo "study done after $(( $(date +%s) - start )) s"
python3 bench/workers_check.py --storage "$url" --json "$OUT/workers_check.json"
python3 -m search report --storage "$url" 2>&1 | grep -v Warning | tail -30
for f in "$OUT"/w*.log; do echo "== $f"; grep -v Warning "$f" | grep -i "lost\|requeue\|error\|evaluated" | tail -6; done
# one archive back (a device call returns at most 8 files): the storage, every worker's log and results.tsv
(cd "$OUT" && tar -cJf workers-run.tar.xz workers.db w*.log results-*.tsv workers_check.json && rm -f workers.db* w*.log results-*.tsv* workers_check.json)
