"""Upstream's SM120 backward with packed (varlen) GQA gradients written where upstream's postprocess reads them.

With GQA (several query heads per K/V head) the backward adds each block's dK and dV into fp32 accumulators, and a
postprocess kernel converts them. For a packed batch both address sequence b's rows at a padded offset, but they
disagree on which: the SM80 epilogue (flash_bwd.py, `padded_offset_k = seqlen.offset_k + batch_idx *
n_block_size`) does not round down to a whole tile, while the postprocess reads at SeqlenInfoQK's
`(offset + batch_idx * tile) // tile * tile`. Wherever a sequence starts off a tile boundary (a packed batch with
an earlier length that is not a multiple of n_block_size), its dK and dV come back wrong, for upstream's configs
as for ours (docs/measurements/2026-12-05-h100-varlen-gqa-backward.md). This class hands the epilogue an offset
that lands its adds on the postprocess's rows; unpacked calls and calls without GQA compile as upstream's.
"""

import dataclasses

import cutlass
import cutlass.cute as cute
from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120

from fa4tune.feasibility import BYTES_PER_ELEMENT, padded_head_dim
from fa4tune.kernel_class import BackwardKernel, Limits


class BackwardSm120(BackwardKernel, FlashAttentionBackwardSm120):
    """Upstream's SM120 backward (SM80 mma.sync), every knob from the config, packed GQA gradients fixed: the
    backward kernel class "sm120", upstream's baseline, and the base of every other backward class."""

    name = "sm120"
    limits = Limits(num_stages=(1, 2), head_dim=(8, 256))
    # export writes knobs into upstream's interface; this class differs from upstream's only by the packed GQA fix,
    # a patch of its own (docs/measurements/data/2026-12-05-upstream-fix-0001-varlen-gqa-dkv-offset.patch)
    upstream = FlashAttentionBackwardSm120
    # upstream's SM80 backward: a sliding window, the soft-cap's backward score_mod, per-sequence lengths
    features = frozenset({"local", "softcap", "seqused", "seqused_q"})

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """The shared storage as it compiles (flash_bwd.py _get_shared_storage_cls), and a breakdown.

        Upstream's can_implement counts only Q, dO, K and V, and lets V_in_regs share Q's and V's space. The struct
        also holds LSE and dPsum (fp32) and the P and dS tiles, each tile 1024-byte aligned, the whole rounded up to
        1024; with V_in_regs its Q field grows to max(Q, V) and sV stays, so nothing is saved. Checked against every
        compiled backward of the H200 sweep (1,326 configs, docs/measurements/2026-12-01-h200-bwd-sweep.md).
        """
        hd, hdv = padded_head_dim(problem_class.head_dim), padded_head_dim(problem_class.head_dim_v)
        m, n = config.m_block_size, config.n_block_size
        k, v = n * hd * BYTES_PER_ELEMENT, n * hdv * BYTES_PER_ELEMENT
        q = m * hd * config.num_stages_Q * BYTES_PER_ELEMENT
        do = m * hdv * config.num_stages_dO * BYTES_PER_ELEMENT
        if config.V_in_regs:
            q = max(q, v)
        lse = (-(-m // 64) * 64 * (config.num_stages_Q - 1) + m) * 4
        p = m * n * BYTES_PER_ELEMENT
        offset = 0
        for size, align in ((k, 1024), (v, 1024), (q, 1024), (do, 1024), (lse, 128), (lse, 128), (p, 128), (p, 128)):
            offset = -(-offset // align) * align + size
        total = -(-offset // 1024) * 1024
        what = "max(Q, V)" if config.V_in_regs else "Q"
        return total, f"K {k} + V {v} + {what} {q} + dO {do} + LSE and dPsum {2 * lse} + P and dS {2 * p}, aligned"

    @cute.jit
    def epilogue(self, acc_dK, acc_dV, mdK, mdV, sdK, sdV, gmem_tiled_copy_dK, gmem_tiled_copy_dV, tiled_mma, tidx,
                 n_block, num_head, batch_size, seqlen, d_head, d_head_v):
        # batch_size is the batch index here (upstream's name); the epilogue adds batch_idx * n_block_size back.
        if cutlass.const_expr(self.qhead_per_kvhead > 1 and seqlen.has_cu_seqlens_k):
            seqlen = dataclasses.replace(seqlen, offset_k=seqlen.padded_offset_k - batch_size * self.n_block_size)
        FlashAttentionBackwardSm120.epilogue(self, acc_dK, acc_dV, mdK, mdV, sdK, sdV, gmem_tiled_copy_dK,
                                             gmem_tiled_copy_dV, tiled_mma, tidx, n_block, num_head, batch_size,
                                             seqlen, d_head, d_head_v)
