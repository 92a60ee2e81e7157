"""Compiles one backward twice with two preprocess thread counts (fake tensors, sm_120a) and prints the thread
count each preprocess object was built with, and how many preprocess kernels were compiled.

Run by tests/test_preprocess_threads.py in a subprocess, since the DSL reads its arch from the environment at import.
"""

import json

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)

import torch  # noqa: E402
from flash_attn.cute import flash_bwd_preprocess  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import experiment  # noqa: E402
from fa4tune import defaults  # noqa: E402
from fa4tune.config import ProblemClass  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

seen = []
original = flash_bwd_preprocess.FlashAttentionBackwardPreprocess.__init__


def recording(self, *args, **kwargs):
    original(self, *args, **kwargs)
    seen.append(self.num_threads)


flash_bwd_preprocess.FlashAttentionBackwardPreprocess.__init__ = recording
host = build(experiment.kernel_class)
pc = ProblemClass(64, 64, False)
fwd, bwd = defaults.upstream_forward(pc), defaults.upstream_backward(pc)
with FakeTensorMode():
    q, k, v = (torch.empty(1, 256, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out, lse, *_ = host.flash_attn_fwd(q, k, v, softmax_scale=0.125, tile_mn=(fwd.tile_m, fwd.tile_n), return_lse=True, sm120_config=fwd)
    for threads in (128, 256, 128):  # the third reuses the first's kernel
        host.flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, softmax_scale=0.125, sm120_config=bwd,
                            sm120_preprocess_threads=threads)
print("PROBE " + json.dumps({"built": seen}))
