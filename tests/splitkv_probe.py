"""Compiles split-KV configs through experiment.attention (fake tensors, sm_120a) and prints, per problem, what the
host path chose and compiled: the splits, whether the kernel ran split (its compile key), the combine kernels
compiled, the kernel's shared storage and its cubin's registers and spills.

Run by tests/test_splitkv.py in a subprocess (the DSL reads its arch from the environment at import time).
stdin: a JSON list of {"config": ForwardConfig dict, "problem": Problem dict}; stdout: one JSON list. A job with
"seqused_k" (one used length per sequence) instead runs the drop-in's call (fa4tune.torch_op.tuned_forward with
experiment.TABLES: the problem's class picks its entry) with those lengths, and reports the debug line too and whether
the split kernel's trace read them (SeqlenInfoQK.create with mSeqUsedK); a paged problem's (page_size) with K and V in
page pools and a page table, reporting the page size the kernel was built for.
"""

import json
import sys

import os

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)

os.environ["CUTE_DSL_KEEP"] = "cubin,ptx"  # the facts are read from the cubin

import experiment  # noqa: E402
from fa4tune.config import ForwardConfig, Problem  # noqa: E402
from fa4tune.fake_compile import _read_cubin, compile_shapes  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

combine_cache = build(experiment.kernel_class).combine_caches[0]  # the PDL combine's (COMBINE_PDL, the default)

instances = []  # every kernel object the host path builds: its is_split_kv is what its trace saw
from kernels.splitkv_forward_sm120 import SplitKvForwardSm120 as split_class  # noqa: E402
original_init = split_class.__init__


def recording_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    instances.append(self)


split_class.__init__ = recording_init  # the class itself (compile keys name it), not a subclass
import kernels.splitkv_forward_sm120 as split_module  # noqa: E402

seqused_traced = []  # per trace of the split kernel: whether SeqlenInfoQK got the used lengths
original_create = split_module.SeqlenInfoQK.create


def recording_create(*args, **kwargs):
    seqused_traced.append(kwargs.get("mSeqUsedK") is not None)
    return original_create(*args, **kwargs)


split_module.SeqlenInfoQK = type("RecordingSeqlenInfoQK", (), {"create": staticmethod(recording_create)})


def dropin_call(problem: Problem, used: list[int]):
    """The drop-in's tuned forward with seqused_k, fake tensors: (config it ran, the debug line, compiled function)."""
    import logging

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4tune import torch_op
    from fa4tune.harness.gate import TORCH_DTYPES

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("fa4tune").addHandler(handler)
    logging.getLogger("fa4tune").setLevel(logging.DEBUG)
    torch_op.use_tables(experiment.TABLES)
    host = build(experiment.kernel_class)
    compiled = []
    host.fwd_cache.listeners.append(lambda key, fn: compiled.append(fn))
    dtype = TORCH_DTYPES[problem.dtype]
    pages = -(-problem.seqlen_k // problem.page_size) if problem.page_size else 0
    with FakeTensorMode():
        lead = (problem.batch * pages, problem.page_size) if pages else (problem.batch, problem.seqlen_k)
        shape = (*lead, problem.num_heads_kv, problem.head_dim)
        q = torch.empty(problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim, dtype=dtype, device="cuda")
        k, v = torch.empty(shape, dtype=dtype, device="cuda"), torch.empty(shape, dtype=dtype, device="cuda")
        seqused_k = torch.tensor(used, dtype=torch.int32).to("cuda")
        page_table = torch.empty(problem.batch, pages, dtype=torch.int32, device="cuda") if pages else None
        torch_op.tuned_forward(q, k, v, None, None, None, seqused_k, page_table, None, None, None, problem.causal, None, None,
                               0.0, 1, None, False)
    line = next(line for line in lines if "tuned forward" in line)
    config = experiment.TABLES.forward_config(problem.problem_class)
    return config, line, compiled


report = []
for job in json.loads(sys.stdin.read()):
    problem = Problem.from_dict(job["problem"])
    combines = dict(combine_cache.cache)
    del instances[:], seqused_traced[:]
    if "seqused_k" in job:
        config, line, compiled = dropin_call(problem, job["seqused_k"])
        facts = {"debug_line": line, "config": config.to_dict(), "seqused_k_traced": list(seqused_traced),
                 **(_read_cubin(compiled[0]) if compiled else {})}
    else:
        config = ForwardConfig.from_dict(job["config"])
        facts = compile_shapes(experiment, "fwd", config, [problem]).resources()
    report.append({
        "splits": experiment.kernel_class(config).num_splits_for(config, problem, 170),
        "split_kv_compiled": [bool(kernel.is_split_kv) for kernel in instances],
        "page_size_built": [kernel.page_size for kernel in instances],
        "local_compiled": [bool(kernel.is_local) for kernel in instances],
        "score_mod_compiled": [kernel.score_mod is not None for kernel in instances],
        "combine": [_read_cubin(fn) for key, fn in combine_cache.cache.items() if key not in combines],
        **facts,
    })
print(json.dumps(report))
