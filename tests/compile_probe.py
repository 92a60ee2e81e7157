"""Compiles configs in this process (fake tensors, sm_120a) and prints what reached the kernel objects.

Run by tests/test_static_check.py in a subprocess, since the DSL reads its arch from the environment
at import time.
"""

import json
import re
import sys

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import experiment  # noqa: E402
from fa4tune.config import BackwardConfig, ForwardConfig  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402

built = []
classes = {}


def class_for(config):
    base = experiment.kernel_class(config)
    if base not in classes:
        def __init__(self, *args, **kwargs):
            base.__init__(self, *args, **kwargs)
            built.append(self)
        classes[base] = type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__})
    return classes[base]


host = build(class_for)
compiled = []
host.fwd_cache.listeners.append(lambda key, fn: compiled.append(fn))
host.bwd_cache.listeners.append(lambda key, fn: compiled.append(fn))
FWD_ATTRS = ("tile_m", "tile_n", "num_threads", "num_stages", "Q_in_regs", "is_causal", "qhead_per_kvhead")
BWD_ATTRS = tuple(BackwardConfig().to_dict()) + ("is_causal", "qhead_per_kvhead")
report = []
for job in json.loads(sys.stdin.read()):
    before = len(compiled)
    with FakeTensorMode():
        s, hd = 512, job["head_dim"]
        q = torch.empty(1, s, 2 * job.get("gqa", 1), hd, dtype=torch.bfloat16, device="cuda")
        kv = torch.empty(1, s, 2, hd, dtype=torch.bfloat16, device="cuda")
        if job["kind"] == "fwd":
            cfg = ForwardConfig.from_dict(job["config"])
            host.flash_attn_fwd(q, kv, kv, causal=job["causal"], tile_mn=(cfg.tile_m, cfg.tile_n), return_lse=True, sm120_config=cfg)
            attrs = FWD_ATTRS
        else:
            cfg = BackwardConfig.from_dict(job["config"])
            lse = torch.empty(1, q.shape[2], s, dtype=torch.float32, device="cuda")
            host.flash_attn_bwd(q, kv, kv, q, q, lse, causal=job["causal"], sm120_config=cfg)
            attrs = BWD_ATTRS
    obj = built[-1]
    new = compiled[before:]
    report.append({
        "kernel": {a: getattr(obj, a) for a in attrs if hasattr(obj, a)},
        "new_compiles": len(new),
        "reqntid": [int(x) for fn in new for x in re.findall(r"\.reqntid (\d+)", fn.__ptx__ or "")],
    })
print("PROBE " + json.dumps({"jobs": report, "fwd_cache": len(host.fwd_cache), "bwd_cache": len(host.bwd_cache)}))
