"""Counts, by tracing SM80 tiled MMAs with the CuTe DSL (CPU, no GPU), the bytes each gemm's warps read from shared
memory: for every warp the distinct (row, k) elements of A and (column, k) elements of B its 32 threads' fragments
hold, as flash_bwd.py's `_get_tiled_mma` lays them out. Run by tests/test_bench_bwd_floor.py in a subprocess (the DSL
fixes its arch on import); argv[1]: a JSON list of [m, n, k, warps_m, warps_n]."""

import json
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_120a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.nvgpu import warp  # noqa: E402


def read_bytes(m, n, k, warps_m, warps_n):
    found = {}

    @cute.jit
    def trace():
        atom = warp.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (16, 8, 16))
        tiled = cute.make_tiled_mma(atom, (warps_m, warps_n, 1), permutation_mnk=(warps_m * 16, warps_n * 16, 16))
        total = 0
        for w in cutlass.range_constexpr(warps_m * warps_n):
            a, b = set(), set()
            for lane in cutlass.range_constexpr(32):
                thr = tiled.get_slice(w * 32 + lane)
                frag_a = thr.partition_A(cute.make_identity_tensor((m, k)))
                frag_b = thr.partition_B(cute.make_identity_tensor((n, k)))
                for i in cutlass.range_constexpr(cute.size(frag_a)):
                    a.add(tuple(frag_a[i]))
                for i in cutlass.range_constexpr(cute.size(frag_b)):
                    b.add(tuple(frag_b[i]))
            total += (len(a) + len(b)) * 2  # bf16
        found["bytes"] = total

    trace()
    return found["bytes"]


print("FRAGMENTS " + json.dumps([read_bytes(*case) for case in json.loads(sys.argv[1])]))
