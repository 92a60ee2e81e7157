"""s16's one-off probe: the new window / soft-cap decode entries on shapes no study tuned on (batch 1 and large
batches), against upstream's SM120 config, DECODE (split-KV, the heuristic's count) and, for the one-split entry,
its tiles with the heuristic's split count. Run from the repo root on the GPU machine:
    python3 docs/measurements/data/2026-12-07-s16-decode-heldout.py"""
import sys
from dataclasses import replace

sys.path.insert(0, ".")
import experiment  # noqa: E402  (the shipped tables)
from bench.dropin_gpu import _time_against_upstream  # noqa: E402

ONE_SPLIT = experiment.FORWARD_DISPATCH["d128-causal-gqa2-window-softcap-decode-bf16"]
SHAPES = [  # label, batch, seqlen_k, heads, heads_kv, head_dim, window left, softcap
    ("Gemma 2 27B local decode b1 8k (4096, 50)", 1, 8192, 32, 16, 128, 4096, 50.0),
    ("Gemma 2 27B local decode b4 32k (4096, 50)", 4, 32768, 32, 16, 128, 4096, 50.0),
    ("gpt-oss-20b sliding decode b1 8k (128)", 1, 8192, 64, 8, 64, 128, 0.0),
    ("gpt-oss-20b sliding decode b64 4k (128)", 64, 4096, 64, 8, 64, 128, 0.0),
]
failures = 0
for label, batch, seqlen_k, heads, heads_kv, head_dim, left, softcap in SHAPES:
    configs = [("DECODE (split-KV, heuristic splits)", experiment.DECODE), ("the table's entry", None)]
    if softcap:
        configs.append(("the entry's tiles, heuristic splits", replace(ONE_SPLIT, extra={"num_splits": 0})))
    failures += _time_against_upstream(label, (batch, seqlen_k, heads, heads_kv, head_dim), left, softcap, configs, 30,
                                       "upstream (SM80 loop)", seqlen_q=1)
print(f"held-out decodes: {'ok' if not failures else f'{failures} failed'}")
