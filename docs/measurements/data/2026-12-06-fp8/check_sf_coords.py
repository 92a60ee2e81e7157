"""BS: trace-time check (no GPU) that the SF gmem partition gives each thread, per (MN atom, k-block), the scale of the
row / column the block-scaled atom's SF TV layout assigns it: prints, for a few lanes, the (row, k) coordinates of
the SFA / SFB values each thread loads next to the rows / cols of the A / B fragment values it holds."""
import os
os.environ.update(CUTE_DSL_ARCH="sm_120a", PYTHONWARNINGS="ignore")
import cutlass, cutlass.cute as cute
from cutlass import Float32, Float8E4M3FN, Float8E8M0FNU
from cutlass.cute.nvgpu import warp
import cutlass.utils.blackwell_helpers as bh


@cute.jit
def check(tidx: cutlass.Constexpr[int], d: cutlass.Constexpr[int]):
    mma = cute.make_tiled_mma(warp.MmaMXF8Op(Float8E4M3FN, Float32, Float8E8M0FNU), (4, 1, 1), permutation_mnk=(64, 16, 32))
    cQ = cute.make_identity_tensor((128, d))
    cK = cute.make_identity_tensor((64, d))
    # SF coordinates as the kernel partitions them: copy partition_S of the (rows, d) view (identity coords here)
    for op, c, tv, tiler in (("A", cQ, bh.get_layoutSFA_TV(mma), (64, 32)), ("B", cK, bh.get_layoutSFB_TV(mma), (16, 32))):
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float8E8M0FNU)
        src = cute.make_tiled_copy(atom, tv, tiler).get_slice(tidx).partition_S(c)
        print(f"t{tidx} SF{op} coords (CPY, MN, K) {src.layout.shape}: MN atom 0,k0:", src[0, 0, 0], "MN1,k0:", src[0, 1, 0],
              "MN0,k1:", src[0, 0, 1], "last val MN0 k0:", src[cute.size(src, mode=[0]) - 1, 0, 0])
    thr = mma.get_slice(tidx)
    a = thr.partition_A(cQ)
    b = thr.partition_B(cK)
    print(f"t{tidx} A frag {a.layout.shape}: atom m0 k0 values", [a[i, 0, 0] for i in range(0, 16, 4)], " m1 k0:", a[0, 1, 0], " m0 k1:", a[0, 0, 1])
    print(f"t{tidx} B frag {b.layout.shape}: atom n0 k0 values", [b[i, 0, 0] for i in range(0, 8, 4)], " n1:", b[0, 1, 0], " n2:", b[0, 2, 0])


for t in (0, 1, 2, 5, 37):
    check(t, 128)
