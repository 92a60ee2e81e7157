"""Compiles the FP8 forward (kernel "sm120_fp8") through its host path's compile (fa4tune.fp8.compile_fp8) with fake
tensors for sm_120a and prints, per case, the cubin's facts as JSON: registers, spills, the shared storage it traced
against the class's formula, and the SASS MMA census (QMMA: e4m3, HMMA: bf16).

Run by tests/test_fp8_kernel.py in a subprocess: the DSL reads its arch from the environment at import time.
    python tests/fp8_probe.py DUMP_DIR < cases.json   # [[head_dim, tile_m, tile_n, num_stages, causal, gqa(, pv_fp8)], ...]
"""

import json
import re
import subprocess
import sys
import tempfile

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)
import os  # noqa: E402

os.environ["CUTE_DSL_KEEP"] = "cubin"  # the facts are read from the cubin

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from fa4tune import fp8  # noqa: E402
from fa4tune.config import ForwardConfig, ProblemClass  # noqa: E402
from fa4tune.cubin import read_cubin, tool_path  # noqa: E402
from kernels.fp8_forward_sm120 import Fp8ForwardSm120  # noqa: E402


def mma_census(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool_path("cuobjdump")), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    census = {}
    for op in re.findall(r"\b([HQ]MMA\.\d+)", sass):
        census[op] = census.get(op, 0) + 1
    return census


report = []
for d, tile_m, tile_n, stages, causal, gqa, *pv in json.load(sys.stdin):  # pv: [True] for the pv_fp8 knob
    config = ForwardConfig(tile_m=tile_m, tile_n=tile_n, num_threads=128, num_stages=stages, Q_in_regs=False, kernel="sm120_fp8",
                           extra={"pv_fp8": bool(pv and pv[0])})
    b, s, h_kv = 1, 1024, 2
    with FakeTensorMode():
        q, k, v = (torch.empty(b, s, h, d, dtype=torch.bfloat16, device="cuda") for h in (h_kv * gqa, h_kv, h_kv))
        (qq, qs), (kq, ks) = fp8.quantize_per_tile(q, tile_m), fp8.quantize_per_tile(k, tile_n)
        out, lse = torch.empty_like(q), torch.empty(b, h_kv * gqa, s, dtype=torch.float32, device="cuda")
        vt_vs = fp8.quantize_v(v, tile_n) if fp8.pv_fp8(config) else ()
        fn, kernel = fp8.compile_fp8(config, qq, qs, kq, ks, v, out, lse, causal, d ** -0.5, *vt_vs)
    facts = read_cubin(fn.__cubin__)
    formula, _ = Fp8ForwardSm120.smem_bytes(config, ProblemClass(d, d, causal, gqa))
    report.append({"case": [d, tile_m, tile_n, stages, causal, gqa, *pv], "registers": facts.registers,
                   "spill_bytes": facts.spill_store_bytes + facts.spill_load_bytes, "smem_traced": kernel.smem_bytes_traced,
                   "smem_formula": formula, "mma": mma_census(fn.__cubin__)})
print(json.dumps(report))
