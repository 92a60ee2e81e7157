"""Checks of kernels.tma_forward_sm120.TmaForwardSm120 that need the DSL (sm_120a, fake tensors, no GPU); prints one JSON line.

Run by tests/test_tma_kernel.py in a subprocess, since the DSL reads its arch from the environment at
import time. Reads {"layouts": [[head_dim, rows, stages], ...], "compiles": [[config, head_dim, causal, gqa], ...]}
on stdin and reports:
- layouts: for every coordinate of each tile, whether upstream's smem layout (swizzle on element offsets,
  what the ldmatrix partitions read) and the TMA view of the same buffer (swizzle on byte addresses, what
  the TMA unit writes) give the same byte;
- compiles: in the PTX of each compiled kernel, the TMA copies (`cp.async.bulk.tensor`) and the bytes each
  mbarrier is armed with (`mbarrier.arrive.expect_tx`).
"""

import json
import re
import sys

from probe_env import dump  # noqa: E402  (first: sets the arch the DSL reads on import)

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import torch  # noqa: E402
from flash_attn.cute import ampere_helpers as sm80_utils  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import experiment  # noqa: E402
from fa4tune.config import ForwardConfig  # noqa: E402
from fa4tune.sm120_interface import build  # noqa: E402
from kernels.tma_forward_sm120 import TmaForwardSm120  # noqa: E402


def byte_swizzle(address: int, bits: int, base: int, shift: int) -> int:
    """A swizzled pointer's address: Swizzle<bits, base, shift> applied to the byte address.

    (Seen in the DSL's PTX: element (1, 0) of a K_SW128 bf16 view is stored at `(base + 128) ^ 16`.)
    """
    mask = ((1 << bits) - 1) << (base + shift)
    return address ^ ((address & mask) >> shift)


def check_layouts(cases):
    results = []

    @cute.jit
    def run():
        for head_dim, rows, stages in cases:
            kernel = TmaForwardSm120(cutlass.BFloat16, head_dim, head_dim, tile_n=rows, num_stages=stages)
            shape = (rows, kernel.tile_hdim, stages)
            upstream = cute.tile_to_shape(sm80_utils.get_smem_layout_atom(cutlass.BFloat16, kernel.tile_hdim), shape, (0, 1, 2))
            tma = kernel._tma_layout(kernel.tile_hdim, shape)
            swizzle = tma.inner
            mismatches = 0
            for s in cutlass.range_constexpr(stages):
                for r in cutlass.range_constexpr(rows):
                    for c in cutlass.range_constexpr(kernel.tile_hdim):
                        read = 2 * upstream((r, c, s))
                        written = byte_swizzle(2 * tma.outer((r, c, s)), swizzle.num_bits, swizzle.num_base, swizzle.num_shift)
                        mismatches += read != written
            results.append({"head_dim": head_dim, "rows": rows, "stages": stages, "swizzle": str(swizzle),
                            "coordinates": rows * kernel.tile_hdim * stages, "mismatches": mismatches})

    run()
    return results


def compile_and_read_ptx(jobs):
    host = build(experiment.kernel_class)
    results = []
    for config, head_dim, causal, gqa in jobs:
        for f in dump.glob("*"):
            f.unlink()
        cfg = ForwardConfig.from_dict(config)
        with FakeTensorMode():
            q = torch.empty(1, 1024, 2 * gqa, head_dim, dtype=torch.bfloat16, device="cuda")
            kv = torch.empty(1, 1024, 2, head_dim, dtype=torch.bfloat16, device="cuda")
            host.flash_attn_fwd(q, kv, kv, causal=causal, tile_mn=(cfg.tile_m, cfg.tile_n), return_lse=True, sm120_config=cfg)
        ptx = next(dump.glob("*.ptx")).read_text()
        moves = dict(re.findall(r"mov\.b32\s+(%r\d+), (\d+);", ptx))
        armed = [moves.get(x, x) for x in re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64\s+%rd\d+, \[%r\d+\], (%r\d+|\d+);", ptx)]
        results.append({
            "tma_copies": len(re.findall(r"cp\.async\.bulk\.tensor\.", ptx)),
            "cp_async_copies": len(re.findall(r"cp\.async\.(?:ca|cg)\.shared", ptx)),
            "expect_tx_bytes": sorted({int(x) if x.isdigit() else x for x in armed}, key=str),
        })
    return results


request = json.loads(sys.stdin.read())
report = {"layouts": check_layouts(request.get("layouts", [])), "compiles": compile_and_read_ptx(request.get("compiles", []))}
print("TMAPROBE " + json.dumps(report))
