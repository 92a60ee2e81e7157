"""Compiles one split-KV config through experiment.attention (fake tensors) for the arch named by the probe's second
argument and prints what the PTX and the host path did about programmatic dependent launch: whether the split
kernel triggers its dependents (`griddepcontrol.launch_dependents`) and which combine compiled (fa4tune's PDL one
or upstream's stream-ordered one).

Run by tests/test_splitkv.py in a subprocess; argv: the dump folder, the arch (sm_120a, sm_90a).
"""

import json
import os
import sys

os.environ["PROBE_ARCH"] = sys.argv[2]
import probe_env  # noqa: E402,F401  (first: sets the arch the DSL reads on import)

import experiment  # noqa: E402
from fa4tune import fake_compile  # noqa: E402
from fa4tune.config import ForwardConfig, Problem  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

fake_compile._clear_dumps = lambda: None  # the PTX is read below
job = json.loads(sys.stdin.read())
pdl_cache, plain_cache = build(experiment.kernel_class).combine_caches
plain_before = len(plain_cache.cache)
fake_compile.compile_shapes(experiment, "fwd", ForwardConfig.from_dict(job["config"]), [Problem.from_dict(job["problem"])])
kernel_ptx = [p for p in probe_env.dump.glob("*SplitKvForwardSm120*.ptx")]
print(json.dumps({
    "kernel_ptx": len(kernel_ptx),
    "triggers_dependents": any("griddepcontrol.launch_dependents" in p.read_text() for p in kernel_ptx),
    "pdl_combines": len(pdl_cache.cache),
    "plain_combines": len(plain_cache.cache) - plain_before,
}))
