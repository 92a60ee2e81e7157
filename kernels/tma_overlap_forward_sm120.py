"""The TMA-fed SM120 forward with the softmax one KV block behind the PV gemm (kernel "sm120_tma_overlap").

Upstream's SM80 order runs, per KV block, S = QK^T, then the softmax on S, then O += PV: the softmax's chain of
dependent instructions (row max, shuffles, exp2, row sum) waits on the QK MMAs' results, and the PV MMAs wait on
the softmax, so within a warp the tensor pipe idles through every softmax. This class issues block n's QK and
the previous block's PV back to back, and runs n's softmax after both: the softmax depends only on S, so it
overlaps the PV MMAs in flight (FA3's intra-warpgroup overlap, upstream's SM90 `intra_wg_overlap`, here per
warp with mma.sync). It costs the registers of one more P tile (S and the previous P are live together).

Everything else is TmaForwardSm120's (kernels/tma_forward_sm120.py): TMA loads on mbarriers, upstream's tiles and
shared storage, its epilogue. One buffer each for K and V (num_stages=1).
"""

# No `from __future__ import annotations` here: the CuTe DSL reads annotations at run time (cute.struct
# fields, cutlass.Constexpr kernel parameters), and string annotations break both.
from functools import partial
from types import SimpleNamespace
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.utils import AuxData

from fa4tune.kernel_class import Limits
from kernels.tma_forward_sm120 import TmaForwardSm120


class TmaOverlapForwardSm120(TmaForwardSm120):
    """TmaForwardSm120 with block n's QK issued before block n+1's PV and n's softmax after both (mainloop)."""

    name = "sm120_tma_overlap"
    limits = Limits(num_stages=(1,))  # one K and one V buffer: the schedule below is written for them

    @cute.jit
    def mainloop(
        self,
        block_info: BlockInfo,
        seqlen: SeqlenInfoQK,
        m_block: Int32,
        n_block_min: Int32,
        n_block_max: Int32,
        mask_fn: Callable,
        mma_params: SimpleNamespace,
        smem_copy_params: SimpleNamespace,
        softmax: Softmax,
        load_K: Callable,
        load_V: Callable,
        wait_K: Callable,
        wait_V: Callable,
        batch_idx: Int32,
        head_idx: Int32,
        aux_data: AuxData,
        fastdiv_mods,
    ):
        """The KV blocks from the last down, the softmax one block behind the PV gemm.

        Step i (block n): wait for K(n), then [not the first step] send V(n+1); S = Q K(n)^T; wait for V(n+1) (the
        first step only syncs), then send K(n-1); O += P(n+1) V(n+1); mask S, online softmax, O *= the row scale,
        P(n) = S. A last O += P V follows the loop. K and V have one buffer each; every load is sent after a CTA
        barrier that all reads of its buffer precede: K(n-1) after every thread's QK(n), V(n+1) after every
        thread's PV(n+2) (the previous step). The barriers' phases: K's i % 2 (one load per step, from the
        prologue's K(n_block_max - 1) on), V's (i - 1) % 2 (its first load is step 1's)."""
        assert not self.is_local, "sm120_tma_overlap: no local (sliding-window) attention"
        P = cute.make_rmem_tensor(mma_params.thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), self.dtype)
        step = partial(
            self.overlap_step, P=P, mma_params=mma_params, smem_copy_params=smem_copy_params, softmax=softmax,
            load_K=load_K, load_V=load_V, wait_K=wait_K, wait_V=wait_V, mask_fn=mask_fn, n_block_min=n_block_min,
            seqlen=seqlen, batch_idx=batch_idx, head_idx=head_idx, m_block=m_block, aux_data=aux_data,
            fastdiv_mods=fastdiv_mods,
        )
        n_block = n_block_max - 1
        step(n_block, Int32(0), mask_seqlen=True, is_first=True)
        iteration = Int32(1)
        if const_expr(self.is_causal):
            n_block_causal = block_info.get_n_block_min_causal_local_mask(seqlen, m_block, n_block_min)
            for n_tile in cutlass.range(n_block_max - 1 - n_block_causal, unroll=1):
                step(n_block_max - 2 - n_tile, iteration, mask_seqlen=True)
                iteration += 1
            n_block = cutlass.min(n_block, n_block_causal)
        for n_tile in cutlass.range(n_block - n_block_min, unroll=1):
            step(n_block - n_tile - 1, iteration, mask_seqlen=False)
            iteration += 1
        # the last block's O += P V (n_block_min's; its V goes out once every thread is done with the buffer)
        cute.arch.barrier()
        load_V(n_block_min, 0)
        wait_V(0, (iteration + 1) % 2)
        self.gemm_PV(P, 0, mma_params, smem_copy_params)

    @cute.jit
    def overlap_step(
        self,
        n_block: Int32,
        iteration: Int32,
        P: cute.Tensor,
        mma_params: SimpleNamespace,
        smem_copy_params: SimpleNamespace,
        softmax: Softmax,
        load_K: Callable,
        load_V: Callable,
        wait_K: Callable,
        wait_V: Callable,
        mask_fn: Callable,
        n_block_min: Int32,
        seqlen: SeqlenInfoQK,
        batch_idx: Int32,
        head_idx: Int32,
        m_block: Int32,
        aux_data: AuxData,
        fastdiv_mods,
        mask_seqlen: cutlass.Constexpr,
        is_first: cutlass.Constexpr = False,
    ):
        """One step of mainloop_overlap: block n's QK, the previous block's PV, block n's softmax (P <- n's)."""
        acc_S = cute.make_rmem_tensor(mma_params.thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S.fill(0.0)
        wait_K(0, iteration % 2)  # K(n) landed; every thread is done with the previous step (its PV read V)
        if const_expr(not is_first):
            load_V(n_block + 1, 0)
        self.gemm_QK(acc_S, 0, n_block, mma_params, smem_copy_params, softmax, seqlen, batch_idx, head_idx, m_block,
                     aux_data, fastdiv_mods)
        if const_expr(is_first):
            cute.arch.barrier()  # every thread is done with K(n)
        else:
            wait_V(0, (iteration + 1) % 2)  # V(n+1) landed; every thread is done with K(n)
        if n_block - 1 >= n_block_min:
            load_K(n_block - 1, 0)
        if const_expr(not is_first):
            self.gemm_PV(P, 0, mma_params, smem_copy_params)  # independent of S: the softmax below overlaps its MMAs
        mask_fn(acc_S, n_block=n_block, mask_mod=self.mask_mod, mask_seqlen=mask_seqlen)
        row_scale = softmax.online_softmax(acc_S, is_first=is_first, check_inf=True)
        softmax.rescale_O(mma_params.acc_O, row_scale)
        P.store(acc_S.load().to(self.dtype))
