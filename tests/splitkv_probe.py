"""Compiles split-KV configs through experiment.attention (fake tensors, sm_120a) and prints, per problem, what the
host path chose and compiled: the splits, whether the kernel ran split (its compile key), the combine kernels
compiled, the kernel's shared storage and its cubin's registers and spills.

Run by tests/test_splitkv.py in a subprocess (the DSL reads its arch from the environment at import time).
stdin: a JSON list of {"config": ForwardConfig dict, "problem": Problem dict}; stdout: one JSON list.
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
report = []
for job in json.loads(sys.stdin.read()):
    config, problem = ForwardConfig.from_dict(job["config"]), Problem.from_dict(job["problem"])
    combines = dict(combine_cache.cache)
    del instances[:]
    facts = compile_shapes(experiment, "fwd", config, [problem])
    report.append({
        "splits": experiment.kernel_class(config).num_splits_for(config, problem, 170),
        "split_kv_compiled": [bool(kernel.is_split_kv) for kernel in instances],
        "combine": [_read_cubin(fn) for key, fn in combine_cache.cache.items() if key not in combines],
        **facts.resources(),
    })
print(json.dumps(report))
