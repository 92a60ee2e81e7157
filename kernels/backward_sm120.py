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


class BackwardSm120(FlashAttentionBackwardSm120):
    """Upstream's SM120 backward (SM80 mma.sync), every knob from the config, packed GQA gradients fixed."""

    @cute.jit
    def epilogue(self, acc_dK, acc_dV, mdK, mdV, sdK, sdV, gmem_tiled_copy_dK, gmem_tiled_copy_dV, tiled_mma, tidx,
                 n_block, num_head, batch_size, seqlen, d_head, d_head_v):
        # batch_size is the batch index here (upstream's name); the epilogue adds batch_idx * n_block_size back.
        if cutlass.const_expr(self.qhead_per_kvhead > 1 and seqlen.has_cu_seqlens_k):
            seqlen = dataclasses.replace(seqlen, offset_k=seqlen.padded_offset_k - batch_size * self.n_block_size)
        FlashAttentionBackwardSm120.epilogue(self, acc_dK, acc_dV, mdK, mdV, sdK, sdV, gmem_tiled_copy_dK,
                                             gmem_tiled_copy_dV, tiled_mma, tidx, n_block, num_head, batch_size,
                                             seqlen, d_head, d_head_v)
