"""Compiles forward configs with and without a learnable sink, and backward configs with and without `deterministic`
(and with a sink), through the host path (fake tensors, sm_120a), and prints each compile's facts: the cubin's
registers, stack and spills, the kernel class's compiled shared storage, and what the PTX holds of the change (the
sink's fold: lg2 instructions; the fixed dQ order: acquire loads and release reductions on the counters).

Run by tests/test_learnable_sink.py in a subprocess (the DSL reads its arch from the environment at import time).
stdin: a JSON list of {"kind": "fwd" | "bwd", "config": config dict, "problem": Problem dict, "sink": bool,
"deterministic": bool}; stdout: one JSON list (after "PROBE ").
"""

import json
import os
import re
import sys

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)

os.environ["CUTE_DSL_KEEP"] = "cubin,ptx"  # the facts are read from the cubin

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import experiment  # noqa: E402
from fa4tune.config import BackwardConfig, ForwardConfig, Problem  # noqa: E402
from fa4tune.fake_compile import _read_cubin, recording_shared_storage  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

host = build(experiment.kernel_class)
compiled = []
host.fwd_cache.listeners.append(lambda key, fn: compiled.append(fn))
host.bwd_cache.listeners.append(lambda key, fn: compiled.append(fn))


def run(job) -> dict:
    problem = Problem.from_dict(job["problem"])
    kind, sink, deterministic = job["kind"], job.get("sink", False), job.get("deterministic", False)
    config = (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(job["config"])
    before, sizes = len(compiled), []
    with FakeTensorMode(), recording_shared_storage(experiment.kernel_class(config), sizes):
        b, sq, sk, h, hkv = problem.batch, problem.seqlen_q, problem.seqlen_k, problem.num_heads, problem.num_heads_kv
        q = torch.empty(b, sq, h, problem.head_dim, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(b, sk, hkv, problem.head_dim, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(b, sk, hkv, problem.head_dim_v, dtype=torch.bfloat16, device="cuda")
        learnable_sink = torch.empty(h, dtype=torch.float32, device="cuda") if sink else None
        if kind == "fwd":
            out, lse, *_ = host.flash_attn_fwd(q, k, v, causal=problem.causal, tile_mn=(config.tile_m, config.tile_n),
                                               return_lse=True, sm120_config=config, learnable_sink=learnable_sink)
            outputs = 2
        else:
            out = torch.empty(b, sq, h, problem.head_dim_v, dtype=torch.bfloat16, device="cuda")
            lse = torch.empty(b, h, sq, dtype=torch.float32, device="cuda")
            grads = host.flash_attn_bwd(q, k, v, out, out, lse, causal=problem.causal, sm120_config=config,
                                        deterministic=deterministic, learnable_sink=learnable_sink)
            outputs = len(grads)
    new = compiled[before:]
    report = {"compiled": len(new), "outputs": outputs}
    if new:
        ptx = new[0].__ptx__ or ""
        report.update(_read_cubin(new[0]), dynamic_smem_bytes=max(sizes, default=0),
                      lg2=len(re.findall(r"\blg2\.approx", ptx)), acquire_loads=len(re.findall(r"ld\.global\.acquire", ptx)),
                      release_adds=len(re.findall(r"red\.release", ptx)))
    return report


print("PROBE " + json.dumps([run(job) for job in json.loads(sys.stdin.read())]))
