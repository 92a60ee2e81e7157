"""The TMA-fed SM120 forward (kernel "sm120_tma"): upstream's math, Q/K/V tiles loaded by TMA on mbarriers.

Its shared memory is upstream's tiles (each a whole number of KB from a 1024-B aligned base, as the 128-byte TMA
swizzle needs) plus one 8-byte mbarrier for Q and one per K stage and per V stage after them, with no padding after
the barriers: the compiled kernel's `SharedStorage.size_in_bytes()` (tests/test_tma_kernel.py checks that). Until
2026-12-03 the struct rounded up to 1024 B, so 32 KB of tiles took 33 KB: 2 CTAs per SM120 SM where 32,792 B make 3.
"""

# No `from __future__ import annotations` here: the CuTe DSL reads annotations at run time (cute.struct
# fields, cutlass.Constexpr kernel parameters), and string annotations break both.
from functools import partial
from types import SimpleNamespace
from typing import Callable, Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.cute.nvgpu import cpasync, warp, warpgroup
from flash_attn.cute import ampere_helpers as sm80_utils
from flash_attn.cute import utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.pack_gqa import PackGQA, make_packgqa_tiled_tma_atom, pack_gqa_layout
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.tile_scheduler import SingleTileScheduler, SingleTileVarlenScheduler, TileSchedulerArguments
from flash_attn.cute.utils import AuxData
from quack import copy_utils, layout_utils

from fa4tune.kernel_class import Limits
from kernels.tuned_forward_sm120 import TunedForwardSm120

MBARRIER_BYTES = 8


def visible_keys(n_block, m_block, warp_last_row, tile_m, tile_n, qhead_packed, seqlen_q, seqlen_k, causal: bool):
    """How many key columns of KV block n_block, from its first, some row of a warp may see, the warp's rows being
    m block m_block's rows up to `warp_last_row` (of the tile): up to seqlen_k, and with causal up to its last query's
    diagonal, bottom-right aligned (with GQA packing a packed row's query is row // qhead_packed, as upstream's mask
    has it). May be <= 0 (the warp sees none) or > tile_n (all). Integer arithmetic only: the kernel calls it with
    Int32 values, the tests with Python ints."""
    col_end = seqlen_k
    if causal:
        last_query = (m_block * tile_m + warp_last_row) // qhead_packed
        col_end = cutlass.min(col_end, last_query + 1 + seqlen_k - seqlen_q)
    return col_end - n_block * tile_n


@dsl_user_op
def opaque_i32(x: Int32, *, loc=None, ip=None) -> Int32:
    """x through an inline-asm move, which the compiler cannot see through: values computed from it before the
    mainloop stay computed. In fp16 the DSL's lowering otherwise reads %tid.x again in the mainloop and rebuilds the
    K tile's shared-memory address from it before every block (6 reads, +6 % loop instructions against bf16, whose
    PTX reads it once: docs/measurements/2026-12-06-fp16-sass-address-remat.md)."""
    return Int32(llvm.inline_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.u32 $0, $1;", "=r,r",
                                 has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                                 loc=loc, ip=ip))


class TmaForwardSm120(TunedForwardSm120):
    """SM120 forward whose Q, K and V tiles arrive by TMA (bulk tensor copies completing on mbarriers).

    The math, the softmax, the masking and the epilogue are upstream's SM80-style code (mma.sync,
    ldmatrix). What differs is how tiles reach shared memory: one elected thread of warp 0 issues a
    TMA copy per tile and arms a "full" mbarrier with the tile's byte count; every thread waits on that
    barrier instead of on cp.async groups. K and V each have `num_stages` buffers and barriers, in
    upstream's schedule (V of block i+stages-1 is issued before the QK gemm of block i, K of block
    i+stages before its PV gemm), so stages=1 still overlaps each load with the other gemm. The CTA
    barrier that follows each wait (as in upstream's cp.async path) is what makes a buffer free to
    overwrite. TMA zero-fills rows past seqlen_k and columns past head_dim, so no load predicates.
    Q goes by TMA too, except with GQA packing when tile_m is not a multiple of qhead_per_kvhead
    (then upstream's cp.async PackGQA load).
    """

    tile_align = 1024  # bytes: where each tile starts (upstream's Align[..., 1024]), as the 128-byte TMA swizzle needs
    # True: in the masked KV blocks (the last one and the causal diagonal's), each warp skips the PV MMAs, and their V
    # reads, over the key columns that no row of its own may see (`warp_visible_cols`). Not the QK ones: trimming
    # those too, or alone, was slower than this on every problem measured (docs/measurements/2026-12-04-h200-trimmed-pv.md)
    trim_masked = False

    name = "sm120_tma"
    limits = Limits(num_stages=(1, 2, 3, 4))  # num_stages is the depth of its K/V mbarrier pipeline
    # a learnable sink folded after the mainloop, as its base class folds it; a sliding window's blocks bounded and
    # masked in `mainloop`; the soft-cap as upstream's host hands it over (a score_mod, applied in gemm_QK)
    features = frozenset({"learnable_sink", "local", "softcap"})

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """Upstream's tiles (whole KBs), then the mbarriers, unpadded."""
        tiles, breakdown = super().smem_bytes(config, problem_class)
        barriers = cls.num_mbarriers(config.num_stages) * MBARRIER_BYTES
        return tiles + barriers, f"{breakdown} + {barriers} B of mbarriers"

    @staticmethod
    def num_mbarriers(num_stages: int) -> int:
        """Q's barrier plus one "full" barrier per K stage and per V stage."""
        return 1 + 2 * num_stages

    def _tma_layout(self, head_dim: int, shape: tuple) -> cute.ComposedLayout:
        """Upstream's smem layout for a (rows, head_dim[, stages]) tile, described the way TMA needs it.

        Upstream's SM80 layouts swizzle element offsets (S<3,3,3> for 16-bit types: position independent),
        while the DSL derives a TMA swizzle mode only from layouts that swizzle byte addresses (SM90's
        S<3,4,3>, applied through a swizzled pointer); given upstream's, it splits each tile into hundreds
        of small boxes. On a 1024-byte aligned buffer the two describe the same bytes, so TMA writes
        exactly what upstream's ldmatrix partitions read (tests/test_tma_kernel.py checks every coordinate).
        """
        upstream_atom = sm80_utils.get_smem_layout_atom(self.dtype, head_dim)
        width_bytes = upstream_atom.outer.shape[1] * self.dtype.width // 8
        kind = {
            128: warpgroup.SmemLayoutAtomKind.K_SW128,
            64: warpgroup.SmemLayoutAtomKind.K_SW64,
            32: warpgroup.SmemLayoutAtomKind.K_SW32,
        }[width_bytes]
        atom = warpgroup.make_smem_layout_atom(kind, self.dtype)
        return cute.tile_to_shape(atom, shape, tuple(range(len(shape))))

    def tile_struct(self, cosize: int):
        """A shared-storage member for `cosize` elements, a whole number of KBs (each tile then starts 1024-aligned on
        the 1024-aligned base, as the 128-byte TMA swizzle needs)."""
        nbytes = cosize * self.dtype.width // 8
        nbytes = -(-nbytes // self.tile_align) * self.tile_align  # whole KBs
        return cute.struct.MemRange[self.dtype, nbytes * 8 // self.dtype.width]

    def _get_shared_storage_cls(self):
        # upstream's tiles, each a whole number of KB so that each starts 1024-aligned on the 1024-aligned base
        # (`kernel` allocates the struct so), as the 128-byte TMA swizzle needs; then the mbarriers. No member is
        # marked Align[1024]: that would round the struct's size up to 1024 and cost the barriers a whole KB.
        tile = self.tile_struct
        sQ_struct, sK_struct, sV_struct = (tile(cute.cosize(layout)) for layout in (self.sQ_layout, self.sK_layout, self.sV_layout))
        sQV_struct = tile(max(cute.cosize(self.sQ_layout), cute.cosize(self.sV_layout)))
        mbar_struct = cute.struct.MemRange[cutlass.Int64, self.num_mbarriers(self.num_stages)]

        @cute.struct
        class SharedStorageQKV:
            sV: sV_struct
            sQ: sQ_struct
            sK: sK_struct
            mbar: mbar_struct

        @cute.struct
        class SharedStorageSharedQV:
            sQ: sQV_struct
            sK: sK_struct
            mbar: mbar_struct

        return SharedStorageQKV if const_expr(not self.Q_in_regs) else SharedStorageSharedQV

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
        """Upstream's SM80 host code, plus the TMA atoms (descriptors) for Q, K and V; a learnable sink goes to the
        kernel, which folds it into each finished row (TunedForwardSm120.fold_learnable_sink)."""
        self._check_type(
            *(t.element_type if t is not None else None for t in (mQ, mK, mV, mO, mLSE, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK))
        )
        tiled_mma_qk, tiled_mma_pv = self._get_tiled_mma()
        self.num_mma_threads = tiled_mma_pv.size
        self.num_producer_threads = self.num_threads
        self.num_Q_load_threads = self.num_threads
        self.num_epilogue_threads = self.num_threads
        self.use_tma_O = False  # O leaves through upstream's register -> smem -> gmem epilogue
        self.use_tma_Q = not (self.pack_gqa and self.tile_m % self.qhead_per_kvhead != 0)
        self._setup_attributes()
        SharedStorage = self._get_shared_storage_cls()
        mQ, mK, mV, mO = [assume_tensor_aligned(t) for t in (mQ, mK, mV, mO)]
        QO_layout_transpose = [1, 3, 2, 0] if const_expr(mCuSeqlensQ is None) else [0, 2, 1]
        KV_layout_transpose = [1, 3, 2, 0] if const_expr(mCuSeqlensK is None) else [0, 2, 1]
        mQ, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=QO_layout_transpose)) for t in (mQ, mO)]
        mK, mV = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=KV_layout_transpose)) for t in (mK, mV)]
        if const_expr(mLSE is not None):
            LSE_layout_transpose = [2, 1, 0] if const_expr(mCuSeqlensQ is None) else [1, 0]
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=LSE_layout_transpose))
        mQ_unpacked = mQ
        if const_expr(self.pack_gqa):
            nheads_kv = mK.shape[2]
            mQ = pack_gqa_layout(mQ, self.qhead_per_kvhead, nheads_kv, head_idx=2)
            mO = pack_gqa_layout(mO, self.qhead_per_kvhead, nheads_kv, head_idx=2)
            if const_expr(mLSE is not None):
                mLSE = pack_gqa_layout(mLSE, self.qhead_per_kvhead, nheads_kv, head_idx=1)

        # TMA atoms: one box per tile (per stage for K/V); the smem layouts are upstream's swizzled ones
        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        sQ_tma_layout = self._tma_layout(self.tile_hdim, (self.tile_m, self.tile_hdim))
        sK_tma_layout = self._tma_layout(self.tile_hdim, (self.tile_n, self.tile_hdim, self.num_stages))
        sV_tma_layout = self._tma_layout(self.tile_hdimv, (self.tile_n, self.tile_hdimv, self.num_stages))
        sK_tile = cute.select(sK_tma_layout, mode=[0, 1])
        sV_tile = cute.select(sV_tma_layout, mode=[0, 1])
        self.tma_bytes_Q = cute.size_in_bytes(self.dtype, sQ_tma_layout)
        self.tma_bytes_K = cute.size_in_bytes(self.dtype, sK_tile)
        self.tma_bytes_V = cute.size_in_bytes(self.dtype, sV_tile)
        tma_atom_Q = None
        if const_expr(self.use_tma_Q):
            if const_expr(self.pack_gqa):
                tma_atom_Q, mQ_load = make_packgqa_tiled_tma_atom(
                    tma_load, mQ_unpacked, sQ_tma_layout, (self.tile_m, self.tile_hdim),
                    qhead_per_kvhead=self.qhead_per_kvhead, head_idx=2,
                )
            else:
                tma_atom_Q, mQ_load = cpasync.make_tiled_tma_atom(tma_load, mQ, sQ_tma_layout, (self.tile_m, self.tile_hdim))
        else:
            mQ_load = mQ
        tma_atom_K, mK_load = cpasync.make_tiled_tma_atom(tma_load, mK, sK_tile, (self.tile_n, self.tile_hdim))
        tma_atom_V, mV_load = cpasync.make_tiled_tma_atom(tma_load, mV, sV_tile, (self.tile_n, self.tile_hdimv))

        TileScheduler = SingleTileVarlenScheduler if const_expr(mCuSeqlensQ is not None or mSeqUsedQ is not None) else SingleTileScheduler
        num_batch = mCuSeqlensQ.shape[0] - 1 if const_expr(mCuSeqlensQ is not None) else cute.size(mQ.shape[3])
        tile_sched_args = TileSchedulerArguments(
            num_block=cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m),
            num_head=cute.size(mQ.shape[2]),
            num_batch=num_batch,
            num_splits=1,
            seqlen_k=0,
            headdim=mQ.shape[1],
            headdim_v=mV.shape[1],
            total_q=cute.size(mQ.shape[0]) if const_expr(mCuSeqlensQ is not None) else cute.size(mQ.shape[0]) * cute.size(mQ.shape[3]),
            tile_shape_mn=(self.tile_m, self.tile_n),
            qhead_per_kvhead_packgqa=self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,
            mCuSeqlensQ=mCuSeqlensQ,
            mSeqUsedQ=mSeqUsedQ,
            cu_total_m_blocks_ptr=mCuTotalMBlocks,
            cu_total_splits_m_blocks_ptr=mCuTotalSplitsMBlocks,
        )
        tile_sched_params = TileScheduler.to_underlying_arguments(tile_sched_args)
        grid_dim = TileScheduler.get_grid_shape(tile_sched_params)
        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(softmax_scale, self.score_mod)
        fastdiv_mods = utils.compute_fastdiv_mods(mQ, mK, self.qhead_per_kvhead, self.pack_gqa, aux_data.tensors)

        self.kernel(
            mQ_load, mK_load, mV_load, mO, mLSE, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK,
            tma_atom_Q, tma_atom_K, tma_atom_V,
            softmax_scale_log2, softmax_scale, window_size_left, window_size_right,
            self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout,
            sQ_tma_layout, sK_tma_layout, sV_tma_layout,
            self.gmem_tiled_copy_Q, self.gmem_tiled_copy_O, tiled_mma_qk, tiled_mma_pv,
            SharedStorage, tile_sched_params, TileScheduler, aux_data, fastdiv_mods, learnable_sink,
        ).launch(grid=grid_dim, block=[self.num_threads, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream)

    def order_tile(self, m_block: Int32, head: Int32, batch: Int32, seqlen_k: Int32):
        """The tile a CTA of the (m blocks, heads, batch) grid runs, from its block index's (and the keys per head, for
        an order that keeps the heads in use within the L2): the same one here (a subclass may hand the tiles out in
        another order)."""
        return m_block, head, batch

    @cute.jit
    def load_tma(self, copy_fn: Callable, mbar: cute.Pointer, num_bytes: cutlass.Constexpr, block: Int32, stage: Int32):
        """Warp 0 arms the stage's barrier with the tile's bytes and issues its TMA copy (one elected lane)."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(mbar + stage, num_bytes)
            copy_fn(src_idx=block, dst_idx=stage, tma_bar_ptr=mbar + stage)

    @cute.jit
    def wait_tma(self, mbar: cute.Pointer, stage: Int32, phase: Int32):
        """All threads: the stage's tile has landed; then a CTA barrier, after which every thread is done
        with the tiles read before this point (their buffers may be refilled)."""
        cute.arch.mbarrier_wait(mbar + stage, phase)
        cute.arch.barrier()

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: Optional[cute.Tensor],
        mCuSeqlensQ: Optional[cute.Tensor],
        mCuSeqlensK: Optional[cute.Tensor],
        mSeqUsedQ: Optional[cute.Tensor],
        mSeqUsedK: Optional[cute.Tensor],
        tma_atom_Q: Optional[cute.CopyAtom],
        tma_atom_K: cute.CopyAtom,
        tma_atom_V: cute.CopyAtom,
        softmax_scale_log2: Float32,
        softmax_scale: Optional[Float32],
        window_size_left: Optional[Int32],
        window_size_right: Optional[Int32],
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        sQ_tma_layout: cute.ComposedLayout,
        sK_tma_layout: cute.ComposedLayout,
        sV_tma_layout: cute.ComposedLayout,
        gmem_tiled_copy_Q: cute.TiledCopy,
        gmem_tiled_copy_O: cute.TiledCopy,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        tile_sched_params,
        TileScheduler: cutlass.Constexpr[Callable],
        aux_data: AuxData = AuxData(),
        fastdiv_mods=None,
        learnable_sink: Optional[cute.Tensor] = None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        # fp16 always; bf16 where a warp owns at most 16 rows, where it costs no registers on sm_120a and the sm_90a
        # build keeps its ldmatrix prefetch (at 32 rows a warp it spills more on sm_120a: bf16 traced as before)
        if const_expr(self.dtype == cutlass.Float16 or self.tile_m // (self.num_threads // 32) <= 16):
            tidx = opaque_i32(tidx)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for tma_atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                if const_expr(tma_atom is not None):
                    cpasync.prefetch_descriptor(tma_atom)
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage, byte_alignment=self.tile_align)  # the tiles' base (see _get_shared_storage_cls)
        # barriers: [Q, K stage 0..S-1, V stage 0..S-1], one arrival each (the expect_tx of the issuing lane)
        mbar_Q = storage.mbar.data_ptr()
        mbar_K = mbar_Q + 1
        mbar_V = mbar_K + self.num_stages
        if warp_idx == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(self.num_mbarriers(self.num_stages)):
                    cute.arch.mbarrier_init(mbar_Q + i, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        tile_scheduler = TileScheduler.create(tile_sched_params)
        work_tile = tile_scheduler.initial_work_tile_info()
        if work_tile.is_valid_tile:
            m_block, num_head, batch_size, _ = work_tile.tile_idx
            if const_expr(TileScheduler is SingleTileScheduler):
                m_block, num_head, batch_size = self.order_tile(m_block, num_head, batch_size, mK.shape[0])
            block_info = BlockInfo(
                self.tile_m, self.tile_n, self.is_causal, self.is_local, False, window_size_left, window_size_right,
                qhead_per_kvhead_packgqa=self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,
            )
            seqlen = SeqlenInfoQK.create(
                batch_idx=batch_size,
                seqlen_q_static=mQ.shape[0] if const_expr(not self.pack_gqa) else mQ.shape[0][1],
                seqlen_k_static=mK.shape[0],
                mCuSeqlensQ=mCuSeqlensQ, mCuSeqlensK=mCuSeqlensK, mSeqUsedQ=mSeqUsedQ, mSeqUsedK=mSeqUsedK,
            )
            n_block_min, n_block_max = block_info.get_n_block_min_max(seqlen, m_block)
            n_block = cutlass.max(n_block_max - 1, 0)

            num_head_kv = num_head if const_expr(self.pack_gqa) else num_head // self.qhead_per_kvhead
            mQ_cur = seqlen.offset_batch_Q(mQ, batch_size, dim=3)[None, None, num_head]
            mK_cur = seqlen.offset_batch_K(mK, batch_size, dim=3)[None, None, num_head_kv]
            mV_cur = seqlen.offset_batch_K(mV, batch_size, dim=3)[None, None, num_head_kv]
            gK = cute.local_tile(mK_cur, (self.tile_n, self.tile_hdim), (None, 0))
            gV = cute.local_tile(mV_cur, (self.tile_n, self.tile_hdimv), (None, 0))

            sQ = storage.sQ.get_tensor(sQ_layout)
            sK = storage.sK.get_tensor(sK_layout)
            if const_expr(not self.Q_in_regs):
                sV = storage.sV.get_tensor(sV_layout)
            else:
                sV = cute.make_tensor(cute.recast_ptr(sQ.iterator, dtype=self.dtype), sV_layout)
            sVt = layout_utils.transpose_view(sV)
            # the same buffers as TMA sees them (swizzled pointers; see _tma_layout)
            sQ_tma = storage.sQ.get_tensor(sQ_tma_layout.outer, swizzle=sQ_tma_layout.inner)
            sK_tma = storage.sK.get_tensor(sK_tma_layout.outer, swizzle=sK_tma_layout.inner)
            if const_expr(not self.Q_in_regs):
                sV_tma = storage.sV.get_tensor(sV_tma_layout.outer, swizzle=sV_tma_layout.inner)
            else:
                sV_tma = storage.sQ.get_tensor(sV_tma_layout.outer, swizzle=sV_tma_layout.inner, dtype=self.dtype)

            copy_K, _, _ = copy_utils.tma_get_copy_fn(tma_atom_K, 0, cute.make_layout(1), gK, sK_tma)
            copy_V, _, _ = copy_utils.tma_get_copy_fn(tma_atom_V, 0, cute.make_layout(1), gV, sV_tma)
            load_K = partial(self.load_tma, copy_K, mbar_K, self.tma_bytes_K)
            load_V = partial(self.load_tma, copy_V, mbar_V, self.tma_bytes_V)

            thr_mma_qk = tiled_mma_qk.get_slice(tidx)
            thr_mma_pv = tiled_mma_pv.get_slice(tidx)
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
            tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK[None, None, 0]))
            tOrVt = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sVt[None, None, 0]))
            acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((self.tile_m, self.tile_hdimv)), Float32)
            acc_O.fill(0.0)

            smem_copy_atom_QK = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
            smem_copy_atom_V = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
            smem_thr_copy_Q = utils.make_tiled_copy_A(smem_copy_atom_QK, tiled_mma_qk).get_slice(tidx)
            smem_thr_copy_K = utils.make_tiled_copy_B(smem_copy_atom_QK, tiled_mma_qk).get_slice(tidx)
            smem_thr_copy_V = utils.make_tiled_copy_B(smem_copy_atom_V, tiled_mma_pv).get_slice(tidx)
            tSsQ = smem_thr_copy_Q.partition_S(sQ)
            tSsK = smem_thr_copy_K.partition_S(sK)
            tOsVt = smem_thr_copy_V.partition_S(sVt)

            softmax = Softmax.create(softmax_scale_log2, num_rows=acc_O.shape[0][0] * acc_O.shape[1], softmax_scale=softmax_scale)
            softmax.reset()
            mma_params = SimpleNamespace(thr_mma_qk=thr_mma_qk, thr_mma_pv=thr_mma_pv, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, acc_O=acc_O,
                                         warp_last_row=self.warp_last_row(thr_mma_qk) if const_expr(self.trim_masked) else None)
            smem_copy_params = SimpleNamespace(
                smem_thr_copy_Q=smem_thr_copy_Q, smem_thr_copy_K=smem_thr_copy_K, smem_thr_copy_V=smem_thr_copy_V,
                tSsQ=tSsQ, tSsK=tSsK, tOsVt=tOsVt,
            )
            # Prologue: Q, then K of the first num_stages blocks and V of the first num_stages-1
            if const_expr(self.use_tma_Q):
                gQ = cute.local_tile(mQ_cur, (self.tile_m, self.tile_hdim), (m_block, 0))
                copy_Q, _, _ = copy_utils.tma_get_copy_fn(tma_atom_Q, 0, cute.make_layout(1), gQ, sQ_tma, single_stage=True)
                if warp_idx == 0:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(mbar_Q, self.tma_bytes_Q)
                    copy_Q(tma_bar_ptr=mbar_Q)
            else:
                pack_gqa = PackGQA(self.tile_m, self.tile_hdim, self.check_hdim_oob, self.qhead_per_kvhead)
                pack_gqa.load_Q(mQ_cur, sQ, gmem_tiled_copy_Q, tidx, m_block, seqlen.seqlen_q)
                cute.arch.cp_async_commit_group()

            def wait_Q():
                if const_expr(self.use_tma_Q):
                    cute.arch.mbarrier_wait(mbar_Q, 0)
                else:
                    cute.arch.cp_async_wait_group(0)
                if const_expr(self.Q_in_regs):
                    cute.arch.barrier()
                    cute.copy(smem_thr_copy_Q, tSsQ, smem_thr_copy_Q.retile(tSrQ))

            if const_expr(self.Q_in_regs):
                # V shares Q's buffer: Q goes to registers before the first V load
                load_K(n_block, 0)
                wait_Q()
                cute.arch.barrier()
            # no load below the first block this tile reads (a sliding window's n_block_min; 0 otherwise): a copy
            # nobody waits for would still be landing when the CTA exits (with Q_in_regs, in the buffer O reuses)
            n_block_floor = n_block_min if const_expr(self.is_local) else 0
            for stage in cutlass.range_constexpr(self.num_stages):
                if const_expr(not self.Q_in_regs or stage > 0):
                    if const_expr(stage == 0):
                        load_K(n_block, 0)
                    elif n_block - stage >= n_block_floor:
                        load_K(n_block - stage, stage)
                if const_expr(stage < self.num_stages - 1):
                    if const_expr(stage == 0):
                        load_V(n_block, 0)
                    elif n_block - stage >= n_block_floor:
                        load_V(n_block - stage, stage)
            if const_expr(not self.Q_in_regs):
                wait_Q()

            # Mainloop: the KV blocks in the schedule of self.mainloop (a subclass may reorder them)
            mask = AttentionMask(
                self.tile_m, self.tile_n, seqlen, window_size_left, window_size_right,
                self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,
            )
            mask_fn = partial(
                mask.apply_mask, batch_idx=batch_size, head_idx=num_head, m_block=m_block, thr_mma=thr_mma_qk,
                mask_causal=self.is_causal, mask_local=self.is_local, aux_data=aux_data,
                fastdiv_mods=fastdiv_mods if const_expr(self.mask_mod is not None) else None,
            )
            self.mainloop(
                block_info, seqlen, m_block, n_block_min, n_block_max, mask_fn, mma_params, smem_copy_params,
                softmax, load_K, load_V, partial(self.wait_tma, mbar_K), partial(self.wait_tma, mbar_V),
                batch_size, num_head, aux_data, fastdiv_mods,
            )

            row_scale = softmax.finalize()
            softmax.rescale_O(acc_O, row_scale)
            if const_expr(learnable_sink is not None):
                self.fold_learnable_sink(acc_O, softmax.row_sum, learnable_sink, tiled_mma_pv, tidx, m_block, num_head)
            sO = cute.make_tensor(sQ.iterator, sO_layout)
            self.epilogue(
                acc_O, softmax.row_sum, mO, mLSE, sO, seqlen, gmem_tiled_copy_O, None, tiled_mma_pv, tidx,
                m_block, num_head, batch_size,
            )

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
        """The KV blocks from the last down (upstream's order): iteration i reads stage i % S at barrier phase
        (i // S) % 2; the last block and the causal diagonal's blocks masked, the rest not. With a sliding window
        (`is_local` with a left side) the blocks stop at n_block_min, those its left edge cuts masked, as upstream's
        SM90 loop has it; upstream's SM80 loop (kernel "sm120") runs every block down to 0 through the mask."""
        compute_one_n_block = partial(
            self.compute_one_n_block,
            mma_params=mma_params, smem_copy_params=smem_copy_params, softmax=softmax,
            load_K=load_K, load_V=load_V, wait_K=wait_K, wait_V=wait_V,
            batch_idx=batch_idx, head_idx=head_idx, m_block=m_block,
            aux_data=aux_data, fastdiv_mods=fastdiv_mods,
            n_block_floor=n_block_min if const_expr(self.is_local) else 0,
        )
        trim = {"trim": True} if const_expr(self.trim_masked) else {}  # the masked blocks' (a subclass's own
        # compute_one_n_block need not take it)
        n_block = cutlass.max(n_block_max - 1, 0)
        iteration = Int32(0)
        compute_one_n_block(
            n_block, iteration, is_first_n_block=True, seqlen=seqlen,
            mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True), **trim,
        )
        iteration += 1
        if const_expr(self.is_causal or self.is_local):
            n_block_min_causal_local_mask = block_info.get_n_block_min_causal_local_mask(seqlen, m_block, n_block_min)
            for n_tile in cutlass.range(n_block_max - 1 - n_block_min_causal_local_mask, unroll=1):
                n_block = n_block_max - 2 - n_tile
                compute_one_n_block(
                    n_block, iteration, seqlen=seqlen,
                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True), **trim,
                )
                iteration += 1
        if const_expr(self.is_local and block_info.window_size_left is not None):
            # inside the window: no mask (but a mask_mod's); then the blocks the window's left edge cuts, masked
            n_block_left = block_info.get_n_block_min_before_local_mask(seqlen, m_block, n_block_min)
            for n_tile in cutlass.range(cutlass.max(n_block - n_block_left, 0), unroll=1):
                compute_one_n_block(
                    n_block - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,
                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False)
                    if const_expr(self.mask_mod is not None) else None,
                )
                iteration += 1
            n_block_left = cutlass.min(n_block, n_block_left)
            for n_tile in cutlass.range(n_block_left - n_block_min, unroll=1):
                compute_one_n_block(
                    n_block_left - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,
                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),
                )
                iteration += 1
        else:
            for n_tile in cutlass.range(n_block, unroll=1):
                compute_one_n_block(
                    n_block - n_tile - 1, iteration, seqlen=seqlen, is_first_n_block=False,
                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False),
                )
                iteration += 1

    @cute.jit
    def compute_one_n_block(
        self,
        n_block: Int32,
        iteration: Int32,
        mma_params: SimpleNamespace,
        smem_copy_params: SimpleNamespace,
        softmax: Softmax,
        load_K: Callable,
        load_V: Callable,
        wait_K: Callable,
        wait_V: Callable,
        batch_idx: cutlass.Int32,
        head_idx: cutlass.Int32,
        m_block: cutlass.Int32,
        seqlen: SeqlenInfoQK,
        aux_data: AuxData = AuxData(),
        fastdiv_mods=None,
        mask_fn: Optional[Callable] = None,
        is_first_n_block: cutlass.Constexpr = False,
        check_inf: cutlass.Constexpr = True,
        trim: cutlass.Constexpr = False,
        n_block_floor=0,
    ):
        """One n_block of S = QK^T and O += PV: upstream's order of loads and gemms, mbarrier waits. `trim` (a masked
        block of a `trim_masked` class): the PV gemm stops at the warp's last visible key column. Loads ahead stop at
        `n_block_floor`, the tile's first block (0 but under a sliding window)."""
        n_valid = self.warp_visible_cols(n_block, m_block, seqlen, mma_params.warp_last_row) if const_expr(trim) else None
        num_stages = self.num_stages
        stage = iteration % num_stages if const_expr(num_stages > 1) else Int32(0)
        phase = (iteration // num_stages) % 2 if const_expr(num_stages > 1) else iteration % 2
        acc_S = cute.make_rmem_tensor(mma_params.thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S.fill(0.0)
        wait_K(stage, phase)  # K of this block; everyone is done with the previous block's V
        if const_expr(num_stages == 1):
            load_V(n_block, 0)
        elif n_block - num_stages + 1 >= n_block_floor:
            load_V(n_block - num_stages + 1, (iteration + num_stages - 1) % num_stages)
        self.gemm_QK(acc_S, stage, n_block, mma_params, smem_copy_params, softmax, seqlen, batch_idx, head_idx, m_block,
                     aux_data, fastdiv_mods)
        if const_expr(num_stages == 1):
            wait_V(stage, phase)  # V of this block; everyone is done with this block's K
            if n_block - 1 >= n_block_floor:
                load_K(n_block - 1, 0)
        if const_expr(mask_fn is not None):
            mask_fn(acc_S, n_block=n_block)
        row_scale = softmax.online_softmax(acc_S, is_first=is_first_n_block, check_inf=check_inf)
        softmax.rescale_O(mma_params.acc_O, row_scale)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        if const_expr(num_stages > 1):
            wait_V(stage, phase)
            if n_block - num_stages >= n_block_floor:
                load_K(n_block - num_stages, stage)
        self.gemm_PV(rP, stage, mma_params, smem_copy_params, n_valid=n_valid)

    @cute.jit
    def gemm_QK(
        self,
        acc_S: cute.Tensor,
        stage: Int32,
        n_block: Int32,
        mma_params: SimpleNamespace,
        smem_copy_params: SimpleNamespace,
        softmax: Softmax,
        seqlen: SeqlenInfoQK,
        batch_idx: Int32,
        head_idx: Int32,
        m_block: Int32,
        aux_data: AuxData,
        fastdiv_mods,
    ):
        """acc_S += Q K^T from K's buffer `stage` (Q from registers with Q_in_regs), then the score_mod if any."""
        sm80_utils.gemm(
            mma_params.thr_mma_qk, acc_S, mma_params.tSrQ, mma_params.tSrK, smem_copy_params.tSsQ,
            smem_copy_params.tSsK[None, None, None, stage], smem_copy_params.smem_thr_copy_Q,
            smem_copy_params.smem_thr_copy_K, A_in_regs=self.Q_in_regs,
        )
        if const_expr(self.score_mod is not None):
            self.apply_score_mod(
                mma_params.thr_mma_qk, batch_idx, head_idx, m_block, acc_S, n_block,
                softmax_scale=softmax.softmax_scale, seqlen=seqlen, aux_data=aux_data, fastdiv_mods=fastdiv_mods,
            )

    @cute.jit
    def gemm_PV(self, P: cute.Tensor, stage: Int32, mma_params: SimpleNamespace, smem_copy_params: SimpleNamespace,
                n_valid: Optional[Int32] = None):
        """O += P V from V's buffer `stage` (P: the softmax's probabilities in the input dtype, S's layout). With
        `n_valid`, only the k steps (keys) that start before it: one branch per count of steps, each branch
        upstream's pipelined loop over its first steps (no branch between a load and its MMA)."""
        tOrP = layout_utils.reshape_acc_to_frgA(P)
        tOsVt = smem_copy_params.tOsVt[None, None, None, stage]
        if const_expr(n_valid is None):
            sm80_utils.gemm_rs(mma_params.thr_mma_pv, mma_params.acc_O, tOrP, mma_params.tOrVt, tOsVt,
                               smem_copy_params.smem_thr_copy_V)
        else:
            num_k = const_expr(cute.size(tOrP.shape[2]))
            k_width = const_expr(self.tile_n // num_k)  # keys per k step
            steps = Int32(0)
            for k in cutlass.range_constexpr(num_k):
                steps += Int32(k * k_width < n_valid)
            smem_thr_copy_V = smem_copy_params.smem_thr_copy_V
            tOrVt_copy_view = smem_thr_copy_V.retile(mma_params.tOrVt)
            for count in cutlass.range_constexpr(1, num_k + 1):
                if steps == count:  # gemm_rs over the first `count` k steps
                    cute.copy(smem_thr_copy_V, tOsVt[None, None, 0], tOrVt_copy_view[None, None, 0])
                    for k in cutlass.range_constexpr(count):
                        if const_expr(k + 1 < count):
                            cute.copy(smem_thr_copy_V, tOsVt[None, None, k + 1], tOrVt_copy_view[None, None, k + 1])
                        cute.gemm(mma_params.thr_mma_pv, mma_params.acc_O, tOrP[None, None, k],
                                  mma_params.tOrVt[None, None, k], mma_params.acc_O)

    @cute.jit
    def warp_last_row(self, thr_mma_qk: cute.TiledMma) -> Int32:
        """The last row of the Q tile that this thread's warp holds in S (the max over its lanes' rows)."""
        tScS = thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        tScS_mn = layout_utils.reshape_acc_to_mn(tScS)
        last = Int32(tScS_mn[0, 0][0])
        for r in cutlass.range_constexpr(1, cute.size(tScS_mn.shape[0])):
            last = cutlass.max(last, Int32(tScS_mn[r, 0][0]))
        return cute.arch.make_warp_uniform(utils.warp_reduce(last, cutlass.max))

    @cute.jit
    def warp_visible_cols(self, n_block: Int32, m_block: Int32, seqlen: SeqlenInfoQK, warp_last_row: Int32) -> Int32:
        """`visible_keys` for this warp in KV block n_block."""
        return visible_keys(n_block, m_block, warp_last_row, self.tile_m, self.tile_n,
                            self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1, seqlen.seqlen_q, seqlen.seqlen_k,
                            self.is_causal)
