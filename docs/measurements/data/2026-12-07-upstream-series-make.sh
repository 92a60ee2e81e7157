#!/usr/bin/env bash
# Regenerates docs/measurements/data/2026-12-07-upstream-series-000N-*.patch/.pr.md (issue #70): the series on
# flash-attn-4 4.0.0b40, each file as upstream's pre-commit (ruff 0.11.13) leaves it, from the shipped storages: the
# standard study, its causal d128 backward study replaced by the one that drew the coordinate-mask class on 2026-12-06
# (that winner needs the R2P mask fix of open PRs #2771 / #2634, so the series exports the study's best trial of
# upstream's kernel and cites them), its decode studies by the decode-classes and decode-causal studies (a later
# --storage's study replaces an earlier's of the same name; tests/test_search_export_series.py reads the same four).
# Run from the repository root:
#   bash docs/measurements/data/2026-12-07-upstream-series-make.sh
# The left-out decode studies: four winners of a fixed num_splits that today's rules refuse on the class's shortest
# problem (num_splits_le_kv_blocks), one winner unconfirmed (d64-causal-decode). The split-KV patch's decode section
# reads the H100 run of 2026-12-05-h100-split-kv-decode-varlen-fp16.md (bench/gpu_splitkv.py --part timing --out).
set -euo pipefail
work=$(mktemp -d)
out=$(mktemp -d)
for name in 2026-12-01-standard-study 2026-12-06-h200-bwd-cmask 2026-12-03-decode-classes-study 2026-12-03-decode-causal-study; do
  xz -dc "docs/measurements/data/$name.db.xz" > "$work/$name.db"
done
uv run python -m search export --storage "sqlite:///$work/2026-12-01-standard-study.db" --storage "sqlite:///$work/2026-12-06-h200-bwd-cmask.db" \
  --storage "sqlite:///$work/2026-12-03-decode-classes-study.db" --storage "sqlite:///$work/2026-12-03-decode-causal-study.db" \
  --series "$out" --screenshots --decode-table docs/measurements/data/2026-12-05-h100-decode-table.jsonl \
  --leave-out fwd:d64-noncausal-gqa8-decode-bf16 --leave-out fwd:d96-noncausal-gqa4-decode-bf16 \
  --leave-out fwd:d96-noncausal-gqa8-decode-bf16 --leave-out fwd:d64-causal-decode-bf16 \
  --leave-out fwd:d128-causal-decode-bf16
# the files take the series' date prefix here; the PR texts' links to the screenshots follow them
for f in "$out"/*; do
  dest="docs/measurements/data/2026-12-07-upstream-series-$(basename "$f")"
  case "$f" in
    # the storages by their shipped names (docs/measurements/data/<name>.db.xz, decompressed), not this run's temp dir
    *.pr.md) sed -e 's|(\([0-9]\{4\}-[a-z0-9-]*\.dashboard\.png\))|(2026-12-07-upstream-series-\1)|' \
               -e "s|sqlite:///$work/|sqlite:///|g" -e "s|--series $out|--series series|g" "$f" > "$dest" ;;
    *) cp "$f" "$dest" ;;
  esac
done
rm -rf "$work" "$out"
