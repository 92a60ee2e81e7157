"""The coordinate-mask backward whose dQ gemm reads K from registers (kernel "sm120_cmask_kregs").

Why: on the H200 the 64x64 backward is bound by shared-memory reads (docs/measurements/2026-12-06-backward-shared-
floor.md); K does not change across a CTA's query blocks, so each warp's slice of K for the dQ gemm can stay in
registers: loaded on the CTA's first query block, read from registers after (8.3 % fewer shared-memory reads a tile
pair at d128 on 8 warps). It works by swapping flash_bwd's `sm80_utils` for one query block's trace: the dQ gemm's B
fragment (`tdQrK`) is routed; every other gemm is upstream's. Measured twin of the coordinate-mask entries
(docs/measurements/2026-12-06-h100-models-twins-varlen.md, SM120 kernels emulated on NVIDIA H100): 1.007-1.025x on
the d128, GQA 4 and d64 causal entries, 0.869x at d96 (56 B of spills there, whose entry stays `sm120_cmask`).
Packed (varlen) calls trace the coordinate-mask body unchanged: the packed batches gated that one.
Searched (inherited) since 2026-12-06: the causal classes' backward studies draw it beside `sm120_cmask` (their
space changed: a new storage, docs/kernel-classes.md), so `search apply` may replace its entries.
"""

from typing import ClassVar

import cutlass
import cutlass.cute as cute
from flash_attn.cute import flash_bwd
from flash_attn.cute.block_info import BlockInfo

from kernels.cmask_backward_sm120 import CausalAnyWarpsBackwardSm120


@cute.jit
def _copy_when(cond: cutlass.Boolean, copy, src: cute.Tensor, dst: cute.Tensor):
    """Each k-slice of `src` (shared memory) into `dst` (registers) through `copy`, where `cond` holds."""
    if cond:
        for k in cutlass.range_constexpr(cute.size(src.shape[2])):
            cute.copy(copy, src[None, None, k], dst[None, None, k])


class _DQFromRegisters:
    """flash_bwd's `sm80_utils` while one query block traces: its dQ gemm (the one whose B fragment is `tdQrK`) reads
    K from registers, loaded from shared memory where `first` holds; every other call is ampere_helpers' own."""

    routed: ClassVar[int] = 0  # dQ gemms traced from registers in this process (tests read it)

    def __init__(self, helpers, tdQrK, first):
        self._helpers, self._tdQrK, self._first = helpers, tdQrK, first

    def __getattr__(self, name):
        return getattr(self._helpers, name)

    def gemm(self, tiled_mma, acc, tCrA, tCrB, tCsA, tCsB, copy_A, copy_B, hook_fn=None, A_in_regs=False,
             B_in_regs=False, swap_AB=False):
        if tCrB is self._tdQrK:
            _DQFromRegisters.routed += 1
            _copy_when(self._first, copy_B, tCsB, copy_B.retile(tCrB))
            B_in_regs = True
        self._helpers.gemm(tiled_mma, acc, tCrA, tCrB, tCsA, tCsB, copy_A, copy_B, hook_fn, A_in_regs=A_in_regs,
                           B_in_regs=B_in_regs, swap_AB=swap_AB)


class KRegsBackwardSm120(CausalAnyWarpsBackwardSm120):
    """The coordinate-mask backward whose dQ gemm keeps each warp's slice of K in registers over the CTA's query
    blocks (the module's docstring says why and what it measured)."""

    name = "sm120_cmask_kregs"

    def compute_one_m_block(self, m_block, *args, mask_fn=None, **kwargs):
        mask = mask_fn.func.__self__
        if cutlass.const_expr(mask.seqlen_info.has_cu_seqlens_q or mask.seqlen_info.has_cu_seqlens_k):
            return super().compute_one_m_block(m_block, *args, mask_fn=mask_fn, **kwargs)  # packed: not gated yet
        info = BlockInfo(self.m_block_size, self.n_block_size, self.is_causal, self.is_local, False,
                         mask.window_size_left, mask.window_size_right)
        first = m_block == info.get_m_block_min_max(mask.seqlen_info, mask_fn.keywords["n_block"])[0]
        helpers = flash_bwd.sm80_utils
        flash_bwd.sm80_utils = _DQFromRegisters(helpers, kwargs["mma_params"].tdQrK, first)
        try:
            return super().compute_one_m_block(m_block, *args, mask_fn=mask_fn, **kwargs)
        finally:
            flash_bwd.sm80_utils = helpers
