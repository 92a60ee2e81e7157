"""The longest-first TMA forward with each SM's second CTA the shortest tile left (kernel "sm120_tma_paired").

Why: `sm120_tma_lpt` hands the tiles out longest first, in one sorted list. The GPU dispatches CTAs in block-index
order, one per SM, round after round, while they fit. So when an SM holds two CTAs at once (the GQA chunked entry: two
64x96 CTAs per SM on SM120) and CTA L shares its SM with CTA L + S (S: the GPU's SMs), the sorted list pairs the
longest tile with the longest of the second round. At the issue's chunked prefill (sq 512 over sk 8K, 8 m blocks x 32
heads = 256 CTAs on 132 SMs) the longest pair is m blocks 7 and 3 (86 + 83 key blocks of 96) where 7 and 0 would give
86 + 81: the makespan of the one wave is the heaviest SM's.

Here the odd rounds of S are reversed (a boustrophedon over the sorted list): CTA S + p runs the tile at
S + (n - 1 - p), n the tiles in that round, so round 1 starts with the shortest tiles, on the SMs whose first CTA has
the longest. Every SM's pair then sums to about the same. It is a permutation of the same tiles for any S, so the
kernel computes the same outputs whatever the dispatch really does; only the schedule depends on it. S is read from
`%nsmid` (the GPU's SM identifiers: 132 on the H200), so the same cubin counts rounds right on any GPU.

Measured (docs/measurements/2026-12-04-h200-tma-paired.md, H200, SM120 kernels emulated): the H200 puts CTA L and
CTA L + 132 on one SM for only 24 of 132 L (a probe in that record), so the pairing holds in part. Still +0.8 % on the
sq 512 over 8K GQA prefill and +4-5 % on the d96 chunked problems over `sm120_tma_lpt`; level or slower elsewhere.
"""

from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

import cutlass
import cutlass.cute as cute

from kernels.tma_lpt_forward_sm120 import TmaLptForwardSm120, longest_first


@dsl_user_op
def num_sm_ids(*, loc=None, ip=None) -> Int32:
    """%nsmid: the number of SM identifiers of the GPU the kernel runs on (its SM count where the ids are contiguous)."""
    return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %nsmid;", "=r", has_side_effects=False,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def paired_longest_first(linear, num_m_blocks, num_heads, num_batch, num_sms):
    """The (m block, head, batch) that CTA number `linear` runs: longest_first's sorted list, each odd round of
    `num_sms` CTAs reversed within itself. Integer arithmetic only (no branch): the kernel calls it with Int32 values,
    the tests with Python ints."""
    total = num_m_blocks * num_heads * num_batch
    round_idx = linear // num_sms
    pos = linear - round_idx * num_sms
    in_round = cutlass.min(num_sms, total - round_idx * num_sms)
    odd = round_idx % 2
    pos = pos + odd * (in_round - 1 - 2 * pos)
    return longest_first(round_idx * num_sms + pos, num_m_blocks, num_heads, num_batch)


class TmaPairedForwardSm120(TmaLptForwardSm120):
    """TmaLptForwardSm120 with each odd round of SM-count CTAs handed its tiles shortest first."""

    name = "sm120_tma_paired"
    features = frozenset({"learnable_sink", "local", "softcap"})  # the base kernel's (sink, window, soft-cap): only the tile order differs
    # searched (inherited): gated on the causal matrix and the entry of the GQA 4 and d96 chunked classes
    # (docs/measurements/2026-12-04-h200-tma-paired.md)

    def order_tile(self, m_block: Int32, head: Int32, batch: Int32, seqlen_k: Int32):
        num_m_blocks, num_heads, num_batch = cute.arch.grid_dim()
        return paired_longest_first(m_block + num_m_blocks * (head + num_heads * batch), num_m_blocks, num_heads,
                                    num_batch, num_sm_ids())
