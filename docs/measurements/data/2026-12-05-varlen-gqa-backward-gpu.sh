set -u
. /opt/devsite/env.sh
export FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 FA4TUNE_RESULTS_TSV=$OUT/results.tsv
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 150 python3 docs/measurements/data/2026-12-05-varlen-gqa-backward-probe.py > $OUT/probe.log 2>&1; echo probe rc $?; grep -v "Warning\|exe_args" $OUT/probe.log | tail -25
timeout 300 python3 bench/varlen.py --rounds 20 > $OUT/varlen.log 2>&1; echo varlen rc $?; grep -v "Warning\|exe_args" $OUT/varlen.log | tail -30
