"""Every backward config that passes the static rules for a class, compiled for sm_120a on each named backward kernel
class: how many compile without spill stores. Record: docs/measurements/2026-12-05-heads-first-backward-static.md.

    uv run python docs/measurements/data/2026-12-05-bwd-causal-spills.py d128-causal-bf16 sm120,sm120_heads_first
"""
import sys, time
sys.path.insert(0, ".")
from dataclasses import replace
from fa4tune.config import ProblemClass
from fa4tune.space import feasible_backward
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from fa4tune.harness.candidates import load_default_experiment
load_default_experiment()
T = get_target("sm120")
pc = ProblemClass.parse(sys.argv[1])
cfgs = list(feasible_backward(pc, T))
kernels = sys.argv[2].split(",")
t = time.time()
facts = run_static([StaticJob("bwd", replace(c, kernel=k), pc) for c in cfgs for k in kernels], T, "experiment.py", workers=2)
print(f"{len(cfgs)} configs x {kernels} in {time.time()-t:.0f} s")
for k in kernels:
    j = kernels.index(k)
    fk = facts[j::len(kernels)]
    z = [f for f in fk if f.ok and f.spill_store_bytes == 0]
    print(k, "ok", sum(f.ok for f in fk), "zero-spill", len(z), "min spill", min(f.spill_store_bytes for f in fk if f.ok))
    for f in z[:8]:
        print("   ", {key: v for key, v in f.config.items()}, f.registers)
