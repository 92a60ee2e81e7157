"""The longest-first TMA forward whose CTAs claim their tiles by SM (kernel "sm120_tma_smpaired"): the first CTA to
start on an SM takes the longest tile left, the second the shortest left.

Why: `sm120_tma_paired` pairs a long tile with a short one only where the GPU puts CTA L and CTA L + S on the same SM,
and the H200 does that for 24 of its 132 SMs (bench/gpu_sm_dispatch.py, docs/measurements/2026-12-04-h200-tma-paired.md).
Replayed on the CTA-to-SM map that probe recorded, whole-tile pairs at the issue's GQA chunked prefill (sq 512 over sk
8K, 256 CTAs of 81-86 key blocks, two per SM) leave the busiest SM with 86 + 85 key blocks under both the longest-first
and the paired order, and 86 + 81 when each SM's pair is chosen on the SM (bench/pairing_model.py).

Measured (docs/measurements/2026-12-04-h200-smpaired-in-head.md, H200, SM120 kernels emulated): correct on the causal
gate matrix (68 rows, launch after launch on one counter), but 1.5 % slower than `sm120_tma_paired` and 0.5 % slower
than `sm120_tma_lpt` on that prefill. The model's 2.3 % did not appear (it had predicted no gain for the paired order
either, which measured +0.8 %): whole-tile sums per SM are not what sets this kernel's time, and the claim (two
dependent atomics before the first load) costs. Not searched; the tile counter stays for a dynamic scheduler.

How: the grid is upstream's; the tile a CTA runs comes from a tile counter in global memory (fa4tune.tile_counter: a
claim word, then one word per SM id). Thread 0 of each CTA reads %smid and adds 1 to its SM's word: an even count
before it (the SM's first, third, ... CTA) claims from the front of the longest-first list, an odd one from the back.
Both ends live in one 64-bit claim word (front count in the low half, back count in the high half), so one atomic
add claims a tile and tells how many were claimed before: front claim f runs rank f, back claim b runs rank N - 1 - b.
The two ends never cross (f + b < N claims), so the claims are a permutation of the grid's tiles whatever the
dispatch does; only the schedule depends on it. The CTA whose claim is the N-th zeroes the claim word and the SM
words, spread over its threads, so the next launch in the stream starts from zero (no memset between launches). The claim
add is acq_rel at GPU scope: the last claimer's reset is ordered after every CTA's SM-word add.

Cost: two dependent global atomics and two CTA barriers before the first load of each CTA.

Limits: one launch at a time per counter (fa4tune.tile_counter keeps one per device and stream). A launch that dies
mid-grid leaves the counter non-zero; CUDA then fails the context, and a new process allocates a new counter.
"""

from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

import cutlass
import cutlass.cute as cute

from fa4tune.tile_counter import CLAIM_WORDS, SM_WORDS, claimed_rank
from kernels.tma_lpt_forward_sm120 import TmaLptForwardSm120, longest_first

FRONT = 1
BACK = 1 << 32
LOW_HALF = (1 << 32) - 1


def _asm(result, operands, text, constraints):
    return llvm.inline_asm(result, operands, text, constraints, has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def sm_id(*, loc=None, ip=None) -> Int32:
    """%smid: the SM this thread runs on."""
    return Int32(_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r"))


@dsl_user_op
def atomic_add_u32(address: Int64, value: Int32, *, loc=None, ip=None) -> Int32:
    """Relaxed 32-bit atomic add at a global address; the old value."""
    return Int32(_asm(T.i32(), [Int64(address).ir_value(loc=loc, ip=ip), Int32(value).ir_value(loc=loc, ip=ip)],
                      "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r"))


@dsl_user_op
def atomic_add_acq_rel_u64(address: Int64, value: Int64, *, loc=None, ip=None) -> Int64:
    """acq_rel, GPU-scope 64-bit atomic add at a global address; the old value."""
    return Int64(_asm(T.i64(), [Int64(address).ir_value(loc=loc, ip=ip), Int64(value).ir_value(loc=loc, ip=ip)],
                      "atom.acq_rel.gpu.global.add.u64 $0, [$1], $2;", "=l,l,l"))


@dsl_user_op
def store_zero_u32(address: Int64, *, loc=None, ip=None) -> None:
    _asm(None, [Int64(address).ir_value(loc=loc, ip=ip)], "st.relaxed.gpu.global.u32 [$0], 0;", "l")


@dsl_user_op
def store_zero_u64(address: Int64, *, loc=None, ip=None) -> None:
    _asm(None, [Int64(address).ir_value(loc=loc, ip=ip)], "st.relaxed.gpu.global.u64 [$0], 0;", "l")


class TmaSmPairedForwardSm120(TmaLptForwardSm120):
    """TmaLptForwardSm120 whose CTAs claim tiles by SM: an SM's even arrivals the longest left, its odd the shortest."""

    name = "sm120_tma_smpaired"
    searched = False  # slower than the static orders where it was meant to help (module docstring)
    tile_counter = True

    @cute.jit
    def claim_tile(self, mTileCounter: cute.Tensor, smem_slot: cute.Pointer):
        num_m_blocks, num_heads, num_batch = cute.arch.grid_dim()
        total = Int32(num_m_blocks * num_heads * num_batch)
        tidx, _, _ = cute.arch.thread_idx()
        slot = cute.make_tensor(cute.recast_ptr(smem_slot, dtype=Int32), cute.make_layout(2))
        base = mTileCounter.iterator.toint()
        if tidx == 0:
            arrival = atomic_add_u32(base + 4 * (CLAIM_WORDS + sm_id() % SM_WORDS), 1)
            back = arrival % 2
            old = atomic_add_acq_rel_u64(base, Int64(FRONT) + Int64(back) * Int64(BACK - FRONT))
            front_before = Int32(old & Int64(LOW_HALF))
            back_before = Int32(old >> Int64(32))
            slot[0] = claimed_rank(back, front_before, back_before, total)
            slot[1] = Int32(front_before + back_before == total - 1)  # the last claim: every SM-word add is done
        cute.arch.barrier()
        rank, last = slot[0], slot[1]
        cute.arch.barrier()  # every thread has read the slot before any load may land on it
        if last == 1:  # zero the counter for the next launch, the SM words spread over the CTA's threads
            if tidx == 0:
                store_zero_u64(base)
            for i in cutlass.range(tidx, SM_WORDS, self.num_threads, unroll=1):
                store_zero_u32(base + 4 * (CLAIM_WORDS + i))
        return longest_first(rank, num_m_blocks, num_heads, num_batch)
