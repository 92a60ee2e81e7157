"""Upstream's SM120 backward whose causal mask holds with the S/dP MMA's warps along n (kernel "sm120_cmask").

Why: upstream's mask (flash_attn/cute/mask.py, AttentionMask.apply_mask) turns a row's column limit into a bit index
for the R2P trick with `sm90_col_to_r2p_idx`, which assumes a thread's accumulator columns at 0, 1, 8, 9, 16, 17,
...: true only when every warp of the S/dP MMA lies along m. With warps along n they step by 8 x warps along n (0, 1,
16, 17, ... for 2), and the causal mask cuts the wrong columns: 187 of 187 causal configs with warps along n failed
the gate on dQ (docs/measurements/2026-12-01-h200-bwd-sweep.md). Here the causal tiles are masked from each element's
own row and column (CoordinateMask), which opens 8 warps on a 64x64 causal tile, and 4 warps as 2 x 2: the causal
entries (docs/measurements/2026-12-06-h100-cmask-sweep.md, 2026-12-06-h200-table44-and-twins.md). Non-causal tiles and
swapped S/dP MMAs run upstream's mask unchanged. For upstream, `search export` carries this class's winners as
upstream's class with the mask fixed in mask.py itself (search/reviewing/mask_fix.py).
"""

import dataclasses
from functools import partial
from typing import ClassVar

import cutlass
import cutlass.cute as cute
from flash_attn.cute.mask import AttentionMask

from fa4tune.verdict import Verdict
from kernels.backward_sm120 import BackwardSm120


@dataclasses.dataclass(frozen=True)
class CoordinateMask(AttentionMask):
    """Upstream's mask, its causal part from each element's own row and column."""

    traces: ClassVar[int] = 0  # causal traces in this process (tests read it)

    @cute.jit
    def apply_mask(self, acc_S, batch_idx, head_idx, m_block, n_block, thr_mma, mask_seqlen, mask_causal,
                   mask_local=False, **options):
        if cutlass.const_expr(not mask_causal or self.swap_AB):
            AttentionMask.apply_mask(self, acc_S, batch_idx, head_idx, m_block, n_block, thr_mma, mask_seqlen,
                                     mask_causal, mask_local, **options)
        else:
            CoordinateMask.traces += 1
            coords = thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                row, col = m_block * self.tile_m + coords[i][0], n_block * self.tile_n + coords[i][1]
                limit = cutlass.min(row + 1 + self.seqlen_k - self.seqlen_q, self.seqlen_k)  # causal, and in seqlen_k
                acc_S[i] = acc_S[i] if col < limit else -cutlass.Float32.inf


class CausalAnyWarpsBackwardSm120(BackwardSm120):
    """Upstream's backward with CoordinateMask: causal S/dP MMAs may put warps along n; searched on causal classes
    (a `kernel` knob in their backward studies), exempt from the one rule it fixes (`fixes`)."""

    name = "sm120_cmask"
    fixes = frozenset({"causal_bwd_SdP_warps_along_m"})

    @classmethod
    def can_implement(cls, config, problem_class, target):
        if not problem_class.causal:  # the coordinate mask changes causal tiles only: the same kernel as upstream's
            return Verdict(False, "cmask_causal_only", f"kernel={cls.name!r} differs from 'sm120' on causal problems "
                           f"only, and {problem_class.name} is not causal: run kernel='sm120'")
        return super().can_implement(config, problem_class, target)

    def compute_one_m_block(self, *args, mask_fn=None, **kwargs):
        mask = None if mask_fn is None else mask_fn.func.__self__
        if mask is not None and not isinstance(mask, CoordinateMask):  # upstream's AttentionMask: the same, ours
            ours = CoordinateMask(*(getattr(mask, f.name) for f in dataclasses.fields(mask)))
            mask_fn = partial(ours.apply_mask, *mask_fn.args, **mask_fn.keywords)
        return BackwardSm120.compute_one_m_block(self, *args, mask_fn=mask_fn, **kwargs)
