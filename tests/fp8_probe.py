"""Compiles the FP8 forward (kernel "sm120_fp8") through its host path's compile (fa4tune.fp8.compile_fp8) with fake
tensors for sm_120a and prints, per case, the cubin's facts as JSON: registers, spills, the shared storage it traced
against the class's formula, and the SASS MMA census (QMMA: e4m3, HMMA: bf16).

With --pv-ptx it instead compiles, per case, a one-warp kernel of the kernel's own P V pieces (pv_fp8): S (fp32,
rows x keys, row-major, from global memory) as the S MMA's C fragment, P through `pv_p_fragment`, V^T (e4m3, dim x
keys, keys contiguous) into shared memory by `vt_gmem_tiled_copy` / `vt_smem_layout`, `sm80_utils.gemm_rs` with the
ldmatrix atom and the m16n8k32 tiling the kernel takes, O (fp32, rows x dim, row-major) stored from the
accumulators; and prints the PTX of each (tests/test_fp8_kernel.py runs it lane by lane).

Run by tests/test_fp8_kernel.py in a subprocess: the DSL reads its arch from the environment at import time.
    python tests/fp8_probe.py DUMP_DIR < cases.json   # [[head_dim, tile_m, tile_n, num_stages, causal, gqa(, pv_fp8)], ...]
    python tests/fp8_probe.py DUMP_DIR --pv-ptx < cases.json   # [[rows, keys, dim(, p_view)], ...]
"""

import json
import re
import subprocess
import sys
import tempfile

import probe_env  # noqa: F401  (first: sets the arch the DSL reads on import)
import os  # noqa: E402

os.environ["CUTE_DSL_KEEP"] = "ptx,cubin"  # the facts are read from the cubin (--pv-ptx: the PTX)

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


def pv_ptx(rows: int, keys: int, dim: int, p_view: bool = False) -> str:
    """The PTX of one warp's P V as the kernel does it (pv_fp8), on a (rows, keys) tile of S and (dim, keys) of V^T.
    p_view: P as the first version of the kernel built it (a pv_frgA_layout view over e4m3 registers in the C
    fragment's order), the negative control of the test."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Float8E4M3FN
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from flash_attn.cute import ampere_helpers as sm80_utils
    from flash_attn.cute import utils
    from kernels.fp8_forward_sm120 import (PV_P_SCALE, fp8_ldmatrix_atom, fp8_tiled_mma, pv_frgA_layout,
                                           pv_p_fragment, vt_gmem_tiled_copy, vt_smem_layout)

    class OneWarpPV:
        @cute.jit
        def __call__(self, mS: cute.Tensor, mVt: cute.Tensor, mO: cute.Tensor, stream: cuda.CUstream):
            sV_layout = vt_smem_layout(dim, keys, 1)

            @cute.struct
            class Storage:
                sV: cute.struct.Align[cute.struct.MemRange[Float8E4M3FN, cute.cosize(sV_layout)], 1024]

            self.kernel(mS, mVt, mO, sV_layout, Storage).launch(grid=[1, 1, 1], block=[32, 1, 1],
                                                                smem=Storage.size_in_bytes(), stream=stream)

        @cute.kernel
        def kernel(self, mS: cute.Tensor, mVt: cute.Tensor, mO: cute.Tensor, sV_layout: cute.ComposedLayout,
                   Storage: cutlass.Constexpr):
            tidx, _, _ = cute.arch.thread_idx()
            tiled_mma = fp8_tiled_mma(Float8E4M3FN, 1)
            thr_mma = tiled_mma.get_slice(tidx)
            sV = cutlass.utils.SmemAllocator().allocate(Storage).sV.get_tensor(sV_layout)
            gmem_thr_copy_V = vt_gmem_tiled_copy(Float8E4M3FN, 32, keys).get_slice(tidx)
            cute.copy(gmem_thr_copy_V, gmem_thr_copy_V.partition_S(mVt), gmem_thr_copy_V.partition_D(sV[None, None, 0]))
            cute.arch.cp_async_commit_group()
            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((rows, keys)), Float32)
            tSgS = thr_mma.partition_C(mS)
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tSgS[i]
            if cutlass.const_expr(p_view):  # the first version's P (negative control)
                rP = cute.make_fragment_like(acc_S, Float8E4M3FN)
                rP.store((acc_S.load() * Float32(PV_P_SCALE)).to(Float8E4M3FN))
                tOrP = cute.make_tensor(rP.iterator, pv_frgA_layout(rP))
            else:
                tOrP = pv_p_fragment(acc_S, Float8E4M3FN)
            tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sV[None, None, 0]))
            smem_thr_copy_V = utils.make_tiled_copy_B(fp8_ldmatrix_atom(Float8E4M3FN), tiled_mma).get_slice(tidx)
            tOsVt = smem_thr_copy_V.partition_S(sV)
            acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((rows, dim)), Float32)
            acc_O.fill(0.0)
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            sm80_utils.gemm_rs(thr_mma, acc_O, tOrP, tOrVt, tOsVt[None, None, None, 0], smem_thr_copy_V)
            tOgO = thr_mma.partition_C(mO)
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                tOgO[i] = acc_O[i]

    tensors = [make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)
               for dtype, shape in ((Float32, (rows, keys)), (Float8E4M3FN, (dim, keys)), (Float32, (rows, dim)))]
    return cute.compile(OneWarpPV(), *tensors, make_fake_stream()).__ptx__


if sys.argv[2:] == ["--pv-ptx"]:
    print(json.dumps([pv_ptx(*case) for case in json.load(sys.stdin)]))
    sys.exit(0)

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
