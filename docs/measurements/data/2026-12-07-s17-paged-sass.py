"""SASS of the split-KV decode (the DECODE entry) for Llama 3 8B decode b8 16K on sm_120a (fake tensors): contiguous (0) or
pages of N tokens. Run: ROOT=<tree> TAG=<name> python <this> <dump dir> N; prints instruction counts by opcode (2026-12-07 s17)."""
import os, sys, json, re, subprocess, collections
ROOT = os.environ.get("ROOT", "/work/main"); sys.path.insert(0, ROOT + "/tests")
import probe_env  # noqa
os.environ["CUTE_DSL_KEEP"] = "cubin,ptx"
sys.path.insert(0, ROOT)
import experiment
from fa4tune.config import Problem
from fa4tune.cubin import tool_path
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from fa4tune import torch_op
from fa4tune.sm120_interface import build

variant = sys.argv[2]
page = int(variant)
torch_op.use_tables(experiment.TABLES)
host = build(experiment.kernel_class)
compiled = []
host.fwd_cache.listeners.append(lambda key, fn: compiled.append(fn))
b, s, h, hk, d = 8, 16384, 32, 8, 128
pages = s // page if page else 0
with FakeTensorMode():
    lead = (b * pages, page) if pages else (b, s)
    q = torch.empty(b, 1, h, d, dtype=torch.bfloat16, device="cuda")
    k = torch.empty(*lead, hk, d, dtype=torch.bfloat16, device="cuda"); v = torch.empty_like(k)
    used = torch.full((b,), s, dtype=torch.int32).to("cuda")
    table = torch.empty(b, pages, dtype=torch.int32, device="cuda") if pages else None
    torch_op.tuned_forward(q, k, v, None, None, None, used, table, None, None, None, True, None, None, 0.0, 1, None, False)
fn = compiled[0]
cubin = fn.__cubin__
path = os.path.join(sys.argv[1], f"p{page}.cubin")
path = path.replace(".cubin", os.environ.get("TAG", "") + ".cubin"); open(path, "wb").write(cubin)
sass = subprocess.run([str(tool_path("nvdisasm")), "-c", path], capture_output=True, text=True).stdout
open(path.replace(".cubin", ".sass"), "w").write(sass)
ops = collections.Counter()
for line in sass.splitlines():
    m = re.match(r"\s*(?:/\*[0-9a-f]+\*/)?\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line.strip().split(";")[0])
    if m and "/*" in line:
        ops[m.group(1)] += 1
print(json.dumps({"page": page, "total": sum(ops.values()), "top": ops.most_common(25)}))
