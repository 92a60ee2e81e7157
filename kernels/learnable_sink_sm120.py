"""A learnable sink (gpt-oss: one logit per query head, a softmax column with no value) folded into a forward's
finished rows: the mixin every forward class of ours inherits through TunedForwardSm120.

With the row's LSE l and the sink s, the LSE becomes l' = log(e^l + e^s) and the output O e^(l - l'): the same numbers
as adding e^(s - max) to the denominator before normalizing (upstream's Softmax.finalize with sink_val); a row that
sees no key gets l' = s and O = 0. It costs an exp and a log per row and a multiply per output element after the
mainloop, so the class's tuned configs serve sink calls as they are (a per-call feature, not a class dimension).
Upstream's SM80 kernel takes no sink argument: `__call__` hands the sink tensor to upstream's kernel as the last of its
aux tensors, `compute_one_n_block` takes it back off (so score_mod sees the caller's own), and `epilogue` folds it. A
class with a kernel of its own (the TMA and split-KV classes) passes the sink as a kernel argument and calls
`fold_learnable_sink` before its epilogue.
"""

# No `from __future__ import annotations` here: the CuTe DSL reads annotations at run time (cutlass.Constexpr).
import math
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120
from flash_attn.cute.utils import AuxData
from quack import layout_utils


def with_last_tensor(aux_data: AuxData, tensor) -> AuxData:
    """aux_data with `tensor` after its own tensors (plain Python: the DSL rewrites `or` in traced code)."""
    return AuxData([*(aux_data.tensors or ()), tensor], aux_data.scalars)


def without_last_tensor(aux_data: AuxData) -> tuple[AuxData, object]:
    """(aux_data without its last tensor, that tensor): with_last_tensor undone."""
    *own, last = aux_data.tensors
    return AuxData(own or None, aux_data.scalars), last


class LearnableSinkFold:
    """Upstream's SM120 forward with a learnable sink folded into its finished rows (a mixin before it in the bases)."""

    # while a kernel traces: whether the sink rides in aux_data (upstream's kernel body), and the sink tensor itself
    sink_in_aux = False
    learnable_sink_traced = None

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: Optional[cute.Tensor],
        softmax_scale: Float32,
        mCuSeqlensQ: Optional[cute.Tensor] = None,
        mCuSeqlensK: Optional[cute.Tensor] = None,
        mSeqUsedQ: Optional[cute.Tensor] = None,
        mSeqUsedK: Optional[cute.Tensor] = None,
        mPageTable: Optional[cute.Tensor] = None,
        window_size_left: Int32 | int | None = None,
        window_size_right: Int32 | int | None = None,
        learnable_sink: Optional[cute.Tensor] = None,
        blocksparse_tensors: Optional[BlockSparseTensors] = None,
        aux_data: AuxData = AuxData(),
        mCuTotalMBlocks: Optional[cute.Tensor] = None,
        mCuTotalSplitsMBlocks: Optional[cute.Tensor] = None,
        stream: cuda.CUstream = None,
    ):
        """Upstream's host code; a learnable sink reaches upstream's kernel as the last of its aux tensors."""
        self.sink_in_aux = learnable_sink is not None
        self.learnable_sink_traced = None
        if const_expr(learnable_sink is not None):
            aux_data = with_last_tensor(aux_data, learnable_sink)
        FlashAttentionForwardSm120.__call__(
            self, mQ, mK, mV, mO, mLSE, softmax_scale, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, mPageTable,
            window_size_left, window_size_right, None, blocksparse_tensors, aux_data, mCuTotalMBlocks,
            mCuTotalSplitsMBlocks, stream,
        )

    def compute_one_n_block(self, *args, aux_data: AuxData = AuxData(), **kwargs):
        # upstream's kernel body hands every block its aux_data: the sink is its last tensor (see __call__)
        if self.sink_in_aux:
            aux_data, self.learnable_sink_traced = without_last_tensor(aux_data)
        return FlashAttentionForwardSm120.compute_one_n_block(self, *args, aux_data=aux_data, **kwargs)

    @cute.jit
    def epilogue(self, acc_O: cute.Tensor, lse: cute.Tensor, mO: cute.Tensor, mLSE: Optional[cute.Tensor],
                 sO: cute.Tensor, seqlen, gmem_tiled_copy_O: cute.TiledCopy, tma_atom_O: Optional[cute.CopyAtom],
                 tiled_mma: cute.TiledMma, tidx: Int32, m_block: Int32, head_idx: Int32, batch_idx: Int32):
        if const_expr(self.learnable_sink_traced is not None):
            self.fold_learnable_sink(acc_O, lse, self.learnable_sink_traced, tiled_mma, tidx, m_block, head_idx)
        FlashAttentionForwardSm120.epilogue(self, acc_O, lse, mO, mLSE, sO, seqlen, gmem_tiled_copy_O, tma_atom_O,
                                            tiled_mma, tidx, m_block, head_idx, batch_idx)

    @cute.jit
    def fold_learnable_sink(self, acc_O: cute.Tensor, lse: cute.Tensor, learnable_sink: cute.Tensor,
                            tiled_mma: cute.TiledMma, tidx: Int32, m_block: Int32, head_idx: Int32):
        """Fold each row's sink logit into its finished output and LSE (the module's docstring: the math). With GQA
        packed into M, `head_idx` is the KV head and a row's query head is its packed row modulo the group."""
        acc_O_mn = layout_utils.reshape_acc_to_mn(acc_O)
        tOcO = layout_utils.reshape_acc_to_mn(
            tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor((self.tile_m, self.tile_hdimv))))
        log2_e = math.log2(math.e)
        for r in cutlass.range_constexpr(cute.size(lse)):
            if const_expr(self.pack_gqa):
                row = m_block * self.tile_m + tOcO[r, 0][0]
                sink = Float32(learnable_sink[head_idx * self.qhead_per_kvhead + row % self.qhead_per_kvhead])
            else:
                sink = Float32(learnable_sink[head_idx])
            top = cutlass.max(lse[r], sink)
            if top != -Float32.inf:  # else no key and no sink: the row stays as it is
                total = top + cute.math.log2(cute.math.exp2((lse[r] - top) * log2_e, fastmath=True)
                                             + cute.math.exp2((sink - top) * log2_e, fastmath=True), fastmath=True) / log2_e
                acc_O_mn[r, None].store(acc_O_mn[r, None].load() * cute.math.exp2((lse[r] - total) * log2_e, fastmath=True))
                lse[r] = total
