"""bench/gpu_decode_floor.py's split-attention prototype (--attention, --merge-attention) computes attention: run by
Triton's interpreter on the CPU (fp16: the interpreter reads no bf16; TRITON_INTERPRET must be set before triton is
imported, so in a process of its own), each call checks itself against torch SDPA, its partials merged by torch
and, with the merge kernel, by that kernel. Splits past the last key (an empty split's row sum is 0) and a key count
that is no multiple of the tile are in the shapes, and a kernel with a wrong softmax scale fails the check."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
import torch
sys.path.insert(0, "bench")
import gpu_decode_floor as g

def inputs(seqlen_k, heads=32, heads_kv=8, dim=128):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen).half() for shape in
            ((1, 1, heads, dim), (1, seqlen_k, heads_kv, dim), (1, seqlen_k, heads_kv, dim))]

def outcome(fn):
    try:
        fn()
        return "ok"
    except AssertionError as e:
        return str(e)

results = {}
# 300 keys, 4 splits of 3 loads of 32: the last load of each split is masked
results["300x4x32"] = outcome(lambda: g.split_attention_calls(*inputs(300), 4, 32, 4))
# 8 splits of 16 over 100 keys (the last split holds 4), merged by the merge kernel
results["100x8x16 merged"] = outcome(lambda: g.split_attention_calls(*inputs(100), 8, 16, 4, "stream"))
# 8 splits of 16 over 40 keys: splits 3-7 hold none (row sum 0, weight 0)
results["40x8x16 merged"] = outcome(lambda: g.split_attention_calls(*inputs(40), 8, 16, 4, "stream"))
results["64 heads per KV head"] = outcome(lambda: g.split_attention_calls(*inputs(64, heads=64, heads_kv=2), 2, 32, 4))
real = g.split_attention_kernel()

class Off:  # the scale argument doubled: a wrong kernel
    def __getitem__(self, grid):
        return lambda *args, **kwargs: real[grid](*args[:6], args[6] * 2, *args[7:], **kwargs)

g.split_attention_kernel = lambda: Off()
results["scale off by 2x"] = outcome(lambda: g.split_attention_calls(*inputs(64), 2, 32, 4))
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("triton")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_prototype_matches_sdpa_with_masked_loads(results):
    assert results["300x4x32"] == "ok"


def test_its_merge_kernel_matches_sdpa_with_short_and_empty_splits(results):
    assert results["100x8x16 merged"] == "ok"
    assert results["40x8x16 merged"] == "ok"


def test_a_wrong_kernel_fails_the_check_with_its_error(results):
    assert results["scale off by 2x"].startswith("split attention prototype is wrong: max error")


def test_more_than_16_query_heads_per_kv_head_is_refused_by_name(results):
    assert "at most 16 query heads per KV head" in results["64 heads per KV head"]
