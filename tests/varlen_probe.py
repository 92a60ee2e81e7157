"""Compiles packed (varlen) calls of experiment.attention in this process (fake tensors, sm_120a), forward and
backward, and prints one JSON line: the configs each ran and the compiled kernels' names. Run by tests/test_varlen.py
in a subprocess, since the DSL reads its arch from the environment at import time."""

import json
import sys

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import experiment  # noqa: E402
from fa4tune.api import attention, problem_class_of  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

host = build(experiment.kernel_class)
compiled = []
for cache in (host.fwd_cache, host.bwd_cache):
    cache.listeners.append(lambda key, fn: compiled.append(key[0][0]))
report = {}
# a packed training batch of GQA 4 d128 causal sequences (a TMA longest-first entry and a varlen entry on
# upstream's class); one batch, as each compile costs seconds (the mapping of every entry is tested in process)
for name, (hq, hkv, d, lengths) in {"gqa4 d128 causal": (16, 4, 128, [300, 1000, 77, 2048])}.items():
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    with FakeTensorMode():
        q = torch.empty(offsets[-1], hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(offsets[-1], hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(offsets[-1], hkv, d, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(len(offsets), dtype=torch.int32, device="cuda")
        packed = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
        before = len(compiled)
        with torch.no_grad():
            out, lse = attention(q, k, v, causal=True, tables=experiment.TABLES, return_lse=True, **packed)
        pc = problem_class_of(q, k, v, True, max(lengths), max(lengths))
        # the backward as _Attention.backward calls it (the autograd engine needs a real device)
        bwd = experiment.backward_config(pc)
        host.flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, softmax_scale=d ** -0.5, causal=True,
                            sm120_config=bwd, sm120_preprocess_threads=experiment.TABLES.preprocess_threads(pc, bwd), **packed)
        report[name] = {"class": pc.name, "entry": experiment.forward_config(pc).kernel,
                        "ran": experiment.TABLES.varlen_forward_config(pc).to_dict(), "out": list(out.shape),
                        "kernels": compiled[before:]}
print(json.dumps(report))
sys.stdout.flush()
