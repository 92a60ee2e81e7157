"""Compiles one sm120_splitkv_cluster config through experiment.attention (fake tensors, sm_120a) and prints what the
host path chose and what the kernel's PTX does: the host's splits (1: no partials, no combine), the cluster size the
kernel traced with, the combines compiled, the cluster barriers and distributed-shared-memory loads in the PTX, and
the cubin's resources.

Run by tests/test_splitkv_cluster.py in a subprocess; argv: the dump folder. stdin: {"config": ..., "problem": ...}.
"""

import json
import os
import sys

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)

os.environ["CUTE_DSL_KEEP"] = "cubin,ptx"  # the facts are read from the cubin, the instructions from the PTX

import experiment  # noqa: E402
from fa4tune import fake_compile  # noqa: E402
from fa4tune.config import ForwardConfig, Problem  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

fake_compile._clear_dumps = lambda: None  # the PTX is read below
pdl_cache, plain_cache = build(experiment.kernel_class).combine_caches
combines_before = len(pdl_cache.cache) + len(plain_cache.cache)
instances = []
cluster_class = experiment.ClusterSplitKvForwardSm120
original_init = cluster_class.__init__


def recording_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    instances.append(self)


cluster_class.__init__ = recording_init
job = json.loads(sys.stdin.read())
config, problem = ForwardConfig.from_dict(job["config"]), Problem.from_dict(job["problem"])
facts = fake_compile.compile_shapes(experiment, "fwd", config, [problem])
ptx = "".join(p.read_text() for p in probe_env.dump.glob("*Cluster*SplitKv*.ptx"))
print(json.dumps({
    "host_splits": experiment.kernel_class(config).num_splits_for(config, problem, 170),
    "cluster_splits": [k.cluster_splits for k in instances],
    "partials": [bool(k.is_split_kv) for k in instances],
    "pack_gqa": [bool(k.pack_gqa) for k in instances],
    "combines": len(pdl_cache.cache) + len(plain_cache.cache) - combines_before,
    "cluster_arrives": ptx.count("barrier.cluster.arrive"),
    "cluster_waits": ptx.count("barrier.cluster.wait"),
    "dsmem_loads": ptx.count("ld.shared::cluster"),
    "triggers_dependents": "griddepcontrol.launch_dependents" in ptx,
    **facts.resources(),
}))
