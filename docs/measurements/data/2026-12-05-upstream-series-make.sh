#!/usr/bin/env bash
# Regenerates docs/measurements/data/2026-12-05-upstream-series-000N-*.patch/.pr.md (issue #43 item 1) from the
# shipped storages: the standard study with its decode study replaced by the decode-classes and decode-causal
# studies (as tests/test_search_export_series.py builds it). Run from the repository root:
#   bash docs/measurements/data/2026-12-05-upstream-series-make.sh
# The left-out decode studies: four winners of a fixed num_splits that today's rules refuse on the class's shortest
# problem (num_splits_le_kv_blocks), one winner unconfirmed (d64-causal-decode).
set -euo pipefail
work=$(mktemp -d)
uv run python - "$work" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from test_search_export_series import shipped_storage
print(shipped_storage(Path(sys.argv[1])))
PY
out=$(mktemp -d)
uv run python -m search export --storage "sqlite:///$work/series.db" --series "$out" \
  --leave-out fwd:d64-noncausal-gqa8-decode-bf16 --leave-out fwd:d96-noncausal-gqa4-decode-bf16 \
  --leave-out fwd:d96-noncausal-gqa8-decode-bf16 --leave-out fwd:d64-causal-decode-bf16 \
  --leave-out fwd:d128-causal-decode-bf16
for f in "$out"/*; do cp "$f" "docs/measurements/data/2026-12-05-upstream-series-$(basename "$f")"; done
rm -rf "$work" "$out"
