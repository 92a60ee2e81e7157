"""Upstream's SM120 backward with its mask on the tiles the mask cuts only (kernel "sm120_edge", non-causal).

Why: upstream's backward masks every query block of a CTA (flash_bwd.py: mask_fn on each m_block, the seqlen_k
mask always), while a tile inside seqlen_k needs none: for a non-causal problem only the key block past seqlen_k's
end does. A branch inside the mask is not enough: ptxas predicates its 40-odd instructions, which still issue. So
each query block traces twice, with the class's mask and with none, under one branch on `tile_needs_mask`
(`MaskWhereCut`). The d128 entry's main loop issues 5.5 % fewer instructions on sm_90a and 17 % fewer on sm_120a,
no spills at d64, d96 or d128 (docs/measurements/2026-12-06-diag-mask-static.md).
Measured (docs/measurements/2026-12-06-h100-s7-twins-ut.md, SM120 kernels emulated on NVIDIA H100, gated, 2
interleaved runs): 1.004-1.015x the `sm120` entry on the d128 non-causal problems, wan2.1's included, which the
d128 non-causal entry now runs. The same mixin on the causal K-in-registers class ran 0.957-0.973x that class at d128
and left the tree (docs/measurements/data/2026-12-06-retired-cmask-diag.patch re-adds it), so this class runs
non-causal problems only. Local windows, swapped S/dP (upstream's transposed mask, not checked against the rule) and
packed batches (as gated) trace upstream's body unchanged.
"""

import dataclasses
from functools import partial
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from kernels.backward_sm120 import BackwardSm120
from kernels.cmask_backward_sm120 import CoordinateMask


def tile_needs_mask(m_block, n_block, tile_m, tile_n, seqlen_q, seqlen_k, causal=True, minimum=min):
    """Whether the backward's mask cuts an element of tile (m_block, n_block): its last column against its first
    row's limit (causal: a row's limit only grows with the row), else against seqlen_k; `minimum`: cutlass.min."""
    limit = minimum(m_block * tile_m + 1 + seqlen_k - seqlen_q, seqlen_k) if causal else seqlen_k
    return (n_block + 1) * tile_n > limit


@dataclasses.dataclass(frozen=True)
class NoMask(CoordinateMask):
    """The mask of a tile that tile_needs_mask clears: nothing to apply."""

    def apply_mask(self, acc_S, *args, **kwargs):
        pass


@cute.jit
def _either(cond: cutlass.Boolean, then, otherwise):
    if cond:
        then()
    else:
        otherwise()


class MaskWhereCut:
    """A backward body's mask on the tiles it cuts only (a mixin before a backward class): each query block traced
    with the class's mask and with none, under one branch on tile_needs_mask."""

    split: ClassVar[int] = 0  # query blocks traced twice in this process (tests read it)

    def compute_one_m_block(self, m_block, *args, mask_fn=None, **kwargs):
        mask = mask_fn.func.__self__
        body = super().compute_one_m_block
        if cutlass.const_expr(self.is_local or self.SdP_swapAB or mask.seqlen_info.has_cu_seqlens_q
                              or mask.seqlen_info.has_cu_seqlens_k):
            return body(m_block, *args, mask_fn=mask_fn, **kwargs)
        MaskWhereCut.split += 1
        none = NoMask(*(getattr(mask, f.name) for f in dataclasses.fields(mask)))
        needs = tile_needs_mask(m_block, mask_fn.keywords["n_block"], self.m_block_size, self.n_block_size,
                                mask.seqlen_q, mask.seqlen_k, self.is_causal, cutlass.min)
        _either(needs, partial(body, m_block, *args, mask_fn=mask_fn, **kwargs),
                partial(body, m_block, *args, mask_fn=partial(none.apply_mask, *mask_fn.args, **mask_fn.keywords),
                        **kwargs))


class EdgeMaskBackwardSm120(MaskWhereCut, BackwardSm120):
    """Upstream's backward with the seqlen_k mask on the last key block only ("sm120_edge"; non-causal problems)."""

    name = "sm120_edge"
    limits = dataclasses.replace(BackwardSm120.limits, causal=False)
