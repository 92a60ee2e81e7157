import json, sys
from dataclasses import replace
from fa4tune.config import ProblemClass
from fa4tune.targets import get_target
from fa4tune.static_check import StaticJob, run_static
from fa4tune import defaults
from search.space import get_space
t = get_target("sm120")
jobs = []
nc = ProblemClass.parse("d256-noncausal-bf16")
for c in get_space("bwd").for_class(nc, t).feasible(nc, t):
    jobs.append(StaticJob("bwd", c, nc))
ca = ProblemClass.parse("d256-causal-bf16")
ub = defaults.upstream_backward(ca)
for a in [(2, 1, 1), (2, 2, 2), (2, 1, 2), (2, 2, 1)]:
    jobs.append(StaticJob("bwd", replace(ub, m_block_size=32, n_block_size=32, num_stages_Q=1, num_stages_dO=1, num_threads=64,
                                         AtomLayoutMSdP=a[0], AtomLayoutNdKV=a[1], AtomLayoutMdQ=a[2]), ca))
dd = ProblemClass.parse("d192v128-causal-bf16")
for c in get_space("bwd").for_class(dd, t).feasible(dd, t):
    jobs.append(StaticJob("bwd", c, dd))
print(len(jobs), "jobs", flush=True)
def on(job, f):
    print(job.label(), f.status, f.registers, f.spill_store_bytes, f.spill_load_bytes, f.dynamic_smem_bytes if hasattr(f,'dynamic_smem_bytes') else '', f.blocks_per_sm, flush=True)
facts = run_static(jobs, t, "experiment.py", workers=2, on_result=on)
with open("/tmp/wide/bwd.jsonl", "w") as out:
    for f in facts:
        out.write(json.dumps(f.to_dict()) + "\n")
