"""BLOCK-SCALED VARIANT of proto.py: S = Q K^T on mma.sync.m16n8k32 kind::mxf8f6f4.block_scale (MmaMXF8Op,
UE8M0 scale per 32 elements of K for Q and K: mQSF[b, h, row, d/32], mKSF[b, h_kv, row, d/32], rows padded to the
tile) instead of MmaFP8Op + per-tile fp32 scales. Changes against proto.py are marked `# BS:`.

FP8 (e4m3) Q/K forward attention for SM120 on top of FA4's SM120 (SM80-path) forward: a CPU-only prototype.

Q, K: Float8E4M3FN (per-tile quantized; q_scale[b, h, m_blocks], k_scale[b, h_kv, n_blocks] fp32 dequant scales),
V, O: bfloat16, LSE: fp32. S = Q K^T on mma.sync m16n8k32 e4m3 (MmaFP8Op), P @ V unchanged (bf16 m16n8k16).

Run from the repository root:  uv run python docs/measurements/data/2026-12-06-fp8/proto_block_scaled.py --bs
(BS_PACKED=1: the inline-PTX path with packed scale words; table_block_scaled.txt has both tables)
It compiles every config below for sm_120a with fake tensors (no GPU) and prints registers, spills, shared
memory and the SASS MMA census (QMMA = e4m3 MMA, HMMA = bf16 MMA) of each cubin; upstream's bf16 kernel is
compiled beside each for comparison. `--ref` also runs the CPU quantization reference self-test.

Every change against upstream flash_attn/cute/flash_fwd.py (FlashAttentionForwardSm80, 4.0.0b36) is marked `# FP8:`.
"""

import os
import sys
import tempfile

if __name__ == "__main__":  # the DSL fixes its arch at import: name sm_120a before cutlass is imported
    _DUMP = os.environ.get("BS_DUMP") or tempfile.mkdtemp(prefix="fp8-proto-")
    os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH="sm_120a", CUTE_DSL_KEEP=os.environ.get("BS_KEEP", "cubin"),
                      CUTE_DSL_DUMP_DIR=_DUMP, PYTHONWARNINGS="ignore")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4))  # fa4tune

import math
import warnings
from functools import partial
from types import SimpleNamespace
from typing import Callable, Optional, Type

warnings.filterwarnings("ignore")

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float8E4M3FN, Float8E8M0FNU, Int32, Uint16, Uint32, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
import cutlass.utils.blackwell_helpers as blackwell_helpers  # BS: SM120 SF partitioning (thrfrg_SFA/SFB)
from cutlass.base_dsl.arch import Arch
from cutlass.cute.nvgpu import cpasync, warp
from quack import layout_utils

from flash_attn.cute import ampere_helpers as sm80_utils
from flash_attn.cute import utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.pack_gqa import PackGQA, pack_gqa_layout
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.tile_scheduler import SingleTileScheduler, SingleTileVarlenScheduler, TileSchedulerArguments
from flash_attn.cute.utils import AuxData

FP8_MAX = 448.0  # largest finite e4m3fn


def fp8_smem_layout_atom(k_dim: int) -> cute.ComposedLayout:
    """FP8: the swizzled smem atom for a 1-byte K-major tile (Q, K): 8 rows of 128/64/32 bytes, 16-byte chunks
    (one ldmatrix row, one 128-bit cp.async) XOR-swizzled as Swizzle<log2(row_bytes/16), 4, 3> on the byte offset:
    the 128-byte line index (offset bits 7..) permutes the line's 16-byte chunks, so the 8 rows one ldmatrix phase
    reads (same chunk column, consecutive rows) hit 8 different chunks of 4 banks: conflict-free for every row
    width. It is the byte-for-byte analogue of upstream's bf16 atom (Swizzle<3,3,3> on 2-byte elements).
    Upstream's get_smem_layout_atom(Float8, d) is not: it counts elements, so a 128-byte e4m3 row gets the
    4-bit swizzle of a 256-byte row (which XORs row bit 0 with offset bit 11), and a 64-byte row gets
    Swizzle<3,4,4>, whose 8 chunks do not fit the row."""
    row_bytes = 128 if k_dim % 128 == 0 else (64 if k_dim % 64 == 0 else 32)
    bits = int(math.log2(row_bytes // 16))
    return cute.make_composed_layout(
        cute.make_swizzle(bits, 4, 3), 0, cute.make_ordered_layout((8, row_bytes), order=(1, 0)))


@dsl_user_op
def mma_mxf8_packed_sf(d, a, b, c, sfa: Uint32, sfb: Uint32, byte_id: int, *, loc=None, ip=None):
    """BS (packed variant): one mma.sync kind::mxf8f6f4.block_scale m16n8k32 e4m3 by inline PTX, the scale byte picked by
    an immediate byte-id from a register that packs up to 4 k-blocks' ue8m0 scales (thread-id 0: SFA row r from
    lane 4(r%8) + r//8, SFB column n from lane 4n, the layout get_layoutSFA_TV / get_layoutSFB_TV describe).
    d, c: 4 Float32; a: 4 Uint32; b: 2 Uint32. cute.gemm's own lowering always uses byte-id 0, thread-id 0."""
    struct_ty = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")
    res = llvm.inline_asm(
        struct_ty,
        [Uint32(x).ir_value(loc=loc, ip=ip) for x in a] + [Uint32(x).ir_value(loc=loc, ip=ip) for x in b]
        + [Float32(x).ir_value(loc=loc, ip=ip) for x in c]
        + [Uint32(sfa).ir_value(loc=loc, ip=ip), Uint32(sfb).ir_value(loc=loc, ip=ip)],
        "mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e4m3.f32.ue8m0 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13}, "
        f"$14, {{{byte_id}, 0}}, $15, {{{byte_id}, 0}};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f,r,r",
        has_side_effects=False,
        loc=loc,
        ip=ip,
    )
    f32 = T.f32()
    return [Float32(llvm.extractvalue(f32, res, [i], loc=loc, ip=ip)) for i in range(4)]


def _sf_group_vmk(t, k_atoms):
    """BS: (from quack.gemm_sm120) group a raw SM120 SF fragment (V, rest-MN modes..., K modes...) to rank 3
    (V, MN, K), walking the K modes off the right until their sizes multiply to k_atoms (= tile_K / 32)."""
    r = cute.rank(t)
    if k_atoms == 1:  # BS packed: no K mode to walk: (V, MN...) -> (V, MN, 1)
        t = cute.group_modes(t, 1, r)
        return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1)))
    i, prod = r, 1
    while prod < k_atoms and i > 1:
        i -= 1
        prod *= cute.size(t, mode=[i])
    t = cute.group_modes(t, i, r)
    return cute.group_modes(t, 1, i)


def sf_broadcast_view(sf_tile: cute.Tensor, rows: int, nsf: int) -> cute.Tensor:
    """BS: a (rows, nsf) tile of ue8m0 scales (row stride dynamic, sf stride 1) seen as the (rows, 32 * nsf) operand
    tile it scales: K = (32, nsf):(0, 1), each scale broadcast over its 32 K elements (the shape thrfrg_SFA/SFB
    partition, like the SM120 smem SF layouts' k_basic_block (sf_vec, mma_nsf):(0, 1))."""
    layout = cute.make_layout((rows, (32, nsf)), stride=(sf_tile.layout.stride[0], (0, sf_tile.layout.stride[1])))
    return cute.make_tensor(sf_tile.iterator, layout)


def sf_word_view(sf_tile: cute.Tensor, rows: int) -> cute.Tensor:
    """BS packed: a (rows,) tile of packed scale words (u32 = 4 k-blocks' ue8m0, byte k = k-block k; u16 for 2) seen
    as a (rows, 32) tile, K broadcast: one word per row, partitioned like one k-block's SFA / SFB."""
    return cute.make_tensor(sf_tile.iterator, cute.make_layout((rows, 32), stride=(sf_tile.layout.stride[0], 0)))


def make_sf_thr_copy(tiled_mma: cute.TiledMma, operand: str, tidx, dtype=Float8E8M0FNU):
    """BS: per-thread universal copy (1 byte a value) with the TV layout the block-scaled atom fixes for SFA / SFB."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype)
    perm = tiled_mma.permutation_mnk
    if operand == "A":
        tv, tiler = blackwell_helpers.get_layoutSFA_TV(tiled_mma), (cute.size(perm[0]), cute.size(perm[2]))
    else:
        tv, tiler = blackwell_helpers.get_layoutSFB_TV(tiled_mma), (cute.size(perm[1]), cute.size(perm[2]))
    return cute.make_tiled_copy(atom, tv, tiler).get_slice(tidx)


def copy_sf(thr_copy, g_view: cute.Tensor, frag: cute.Tensor):
    """BS: gmem -> registers, one ue8m0 byte per (thread, MN atom, k-block): filter the stride-0 broadcast after
    slicing each k-block so every scale is loaded once (as quack's copy_sf_block does from smem)."""
    src = thr_copy.partition_S(g_view)
    dst = thr_copy.retile(frag)
    for k in range(cute.size(frag, mode=[2])):  # plain python: this helper is not preprocessed
        cute.copy(thr_copy, cute.filter_zeros(src[None, None, k]), cute.filter_zeros(dst[None, None, k]))


class FlashAttentionForwardSm120Fp8(FlashAttentionForwardSm120):
    """SM120 forward with e4m3 Q/K (QMMA m16n8k32 for S = QK^T), bf16 V/O, per-tile dequant scales."""

    def __init__(self, *args, qk_dtype: Type[cutlass.Numeric] = Float8E4M3FN, **kwargs):
        super().__init__(*args, **kwargs)  # `dtype` (first arg) stays the V / O / P type (bf16)
        self.qk_dtype = qk_dtype  # FP8: the Q / K type
        assert not self.Q_in_regs, "FP8 prototype: Q_in_regs (sV aliasing the fp8 sQ) is not supported"
        # FP8: m16n8k32 steps K by 32: the padded head dim must be a multiple of 32 (32, 64, 96, 128, 192, 256)
        assert self.tile_hdim % 32 == 0, f"FP8: head_dim must pad to a multiple of 32, got {self.tile_hdim}"
        assert self.score_mod is None, "FP8 prototype: score_mod not wired (it would see the dequantized S; untested)"
        self.smem_bytes_traced = None  # the SharedStorage struct's size, recorded at trace time
        self.print_sf_layouts = True  # BS: print the SF fragment layouts at trace time
        self.sf_packed = os.environ.get("BS_PACKED", "0") == "1"  # BS: inline-PTX mma with byte-id-packed SF regs

    # FP8: Q and K may be e4m3 while V and O are bf16
    def _check_type(self, mQ_type, mK_type, mV_type, mO_type, mLSE_type, *rest):
        if const_expr(not (mQ_type == mK_type == self.qk_dtype)):
            raise TypeError(f"Q and K must be {self.qk_dtype}, got {mQ_type}, {mK_type}")
        if const_expr(not (mV_type == mO_type == self.dtype)):
            raise TypeError(f"V and O must be {self.dtype}, got {mV_type}, {mO_type}")
        if const_expr(mLSE_type not in [None, Float32]):
            raise TypeError("LSE tensor must be Float32")

    # FP8: the Q / K smem atoms in the 1-byte type (a K tile is tile_n * d bytes, half of bf16's)
    def _get_smem_layout_atom(self):
        _, _, sV_layout_atom, sO_layout_atom, sP_layout_atom = super()._get_smem_layout_atom()
        sQ_layout_atom = fp8_smem_layout_atom(self.tile_hdim)
        return sQ_layout_atom, sQ_layout_atom, sV_layout_atom, sO_layout_atom, sP_layout_atom

    def _setup_attributes(self):
        super()._setup_attributes()  # sQ/sK layouts from the fp8 atoms; V / O copies in bf16 as upstream
        # FP8: upstream builds the Q / K cp.async copies for self.dtype (8 bf16 = 16 B per thread, a thread row
        # of atom_cols/8 threads); rebuild them for the 1-byte type: 16 e4m3 = 16 B per thread.
        bits = 128
        elems = bits // self.qk_dtype.width
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.qk_dtype,
                                   num_bits_per_copy=bits)
        cols = fp8_smem_layout_atom(self.tile_hdim).outer.shape[1] // elems
        assert self.num_Q_load_threads % cols == 0 and self.num_producer_threads % cols == 0
        tQ_layout = cute.make_ordered_layout((self.num_Q_load_threads // cols, cols), order=(1, 0))
        tK_layout = cute.make_ordered_layout((self.num_producer_threads // cols, cols), order=(1, 0))
        assert self.tile_m % tQ_layout.shape[0] == 0
        v_layout = cute.make_layout((1, elems))
        self.gmem_tiled_copy_Q = cute.make_tiled_copy_tv(atom, tQ_layout, v_layout)
        self.gmem_tiled_copy_K = cute.make_tiled_copy_tv(atom, tK_layout, v_layout)

    # FP8: S = Q K^T on mma.sync.m16n8k32.e4m3.e4m3.f32 (SASS QMMA.16832); P V stays bf16 m16n8k16.
    # Same warp tiling as upstream (num_threads/32 warps along M, N permuted to 16 so one ldmatrix.x4 of K
    # covers two n8 atoms); the K permutation is the atom's 32.
    def _get_tiled_mma(self):
        _, tiled_mma_pv = super()._get_tiled_mma()
        warps = self.num_threads // 32
        tiled_mma_qk = cute.make_tiled_mma(
            warp.MmaMXF8Op(self.qk_dtype, Float32, Float8E8M0FNU),  # BS: block-scaled m16n8k32, ue8m0 per 32 K
            (warps, 1, 1),
            permutation_mnk=(warps * 16, 16, 32),
        )
        return tiled_mma_qk, tiled_mma_pv

    # FP8: sQ / sK are 1-byte ranges. The epilogue stages O (bf16, tile_m * dv * 2 bytes) through sQ's address,
    # which is now half that size: sQ comes first and sV right after, and sQ is padded so that sQ + sV hold O
    # (the epilogue's barrier already orders it after every thread's last read of V, as upstream's Q_in_regs
    # aliasing of sV and sO relies on). sK stays out of the way.
    def _get_shared_storage_cls(self):
        cosize_Q, cosize_K, cosize_V, cosize_O = [
            cute.cosize(layout) for layout in (self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout)]
        bytes_V = cosize_V * self.dtype.width // 8
        bytes_O = cosize_O * self.dtype.width // 8
        elems_Q = max(cosize_Q, (bytes_O - bytes_V) * 8 // self.qk_dtype.width)
        sQ_struct = cute.struct.Align[cute.struct.MemRange[self.qk_dtype, elems_Q], 1024]
        sV_struct = cute.struct.Align[cute.struct.MemRange[self.dtype, cosize_V], 1024]
        sK_struct = cute.struct.Align[cute.struct.MemRange[self.qk_dtype, cosize_K], 1024]

        @cute.struct
        class SharedStorageFp8:
            sQ: sQ_struct
            sV: sV_struct
            sK: sK_struct

        offset_V = -(-elems_Q * self.qk_dtype.width // 8 // 1024) * 1024
        assert offset_V + bytes_V >= bytes_O, "FP8: sQ + sV must hold sO"
        self.smem_bytes_traced = int(SharedStorageFp8.size_in_bytes())
        return SharedStorageFp8

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
        mQSF: Optional[cute.Tensor] = None,  # FP8: (batch, num_head, m_blocks) fp32 dequant scale of Q tiles
        mKSF: Optional[cute.Tensor] = None,  # FP8: (batch, num_head_kv, n_blocks) fp32 dequant scale of K tiles
        # Always keep stream as the last parameter (EnvStream: obtained implicitly via TVM FFI).
        stream: cuda.CUstream = None,
    ):
        """Configures and launches the flash attention kernel.

        mQ/mK/mV/mO has same data types(supports fp16 and bf16) and same layout:
        (batch_size, seqlen_q, num_head, head_dim):(_, _, _, 1)
        """
        assert learnable_sink is None, "Learnable sink is not supported in this kernel"
        # FP8: per-tile scales index (batch, head, block) of the non-varlen layout
        assert (mQSF is None) == (mKSF is None), "FP8: pass both q_scale and k_scale, or neither"
        if const_expr(mQSF is not None):
            assert mCuSeqlensQ is None and mCuSeqlensK is None and mSeqUsedQ is None and mSeqUsedK is None, \
                "FP8 prototype: per-tile scales are indexed (batch, head, block): no varlen"
        self._check_type(
            *(t.element_type if t is not None else None for t in (mQ, mK, mV, mO, mLSE, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK))
        )
        tiled_mma_qk, tiled_mma_pv = self._get_tiled_mma()
        self.num_mma_threads = tiled_mma_pv.size
        self.num_producer_threads = self.num_threads
        self.num_Q_load_threads = self.num_threads
        self.num_epilogue_threads = self.num_threads
        self.use_tma_O = Arch.sm_90 <= self.arch < Arch.sm_120
        self._setup_attributes()
        SharedStorage = self._get_shared_storage_cls()
        mQ, mK, mV, mO = [assume_tensor_aligned(t) for t in (mQ, mK, mV, mO)]
        # Layout permutation: 4D non-varlen vs 3D varlen
        QO_layout_transpose = [1, 3, 2, 0] if const_expr(mCuSeqlensQ is None) else [0, 2, 1]
        KV_layout_transpose = [1, 3, 2, 0] if const_expr(mCuSeqlensK is None) else [0, 2, 1]
        mQ, mO = [
            cute.make_tensor(t.iterator, cute.select(t.layout, mode=QO_layout_transpose))
            for t in (mQ, mO)
        ]
        mK, mV = [
            cute.make_tensor(t.iterator, cute.select(t.layout, mode=KV_layout_transpose))
            for t in (mK, mV)
        ]
        if const_expr(mLSE is not None):
            LSE_layout_transpose = [2, 1, 0] if const_expr(mCuSeqlensQ is None) else [1, 0]
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=LSE_layout_transpose))
        if const_expr(self.pack_gqa):
            nheads_kv = mK.shape[2]
            mQ = pack_gqa_layout(mQ, self.qhead_per_kvhead, nheads_kv, head_idx=2)
            mO = pack_gqa_layout(mO, self.qhead_per_kvhead, nheads_kv, head_idx=2)
            if const_expr(mLSE is not None):
                mLSE = pack_gqa_layout(mLSE, self.qhead_per_kvhead, nheads_kv, head_idx=1)
        # TileScheduler for varlen, simple grid for non-varlen
        if const_expr(mCuSeqlensQ is not None or mSeqUsedQ is not None):
            TileScheduler = SingleTileVarlenScheduler
        else:
            TileScheduler = SingleTileScheduler
        num_batch = (
            mCuSeqlensQ.shape[0] - 1
            if const_expr(mCuSeqlensQ is not None)
            else cute.size(mQ.shape[3])
        )
        tile_sched_args = TileSchedulerArguments(
            num_block=cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m),
            num_head=cute.size(mQ.shape[2]),
            num_batch=num_batch,
            num_splits=1,
            seqlen_k=0,
            headdim=mQ.shape[1],
            headdim_v=mV.shape[1],
            total_q=cute.size(mQ.shape[0])
            if const_expr(mCuSeqlensQ is not None)
            else cute.size(mQ.shape[0]) * cute.size(mQ.shape[3]),
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
            mQ,
            mK,
            mV,
            mO,
            mLSE,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSeqUsedQ,
            mSeqUsedK,
            softmax_scale_log2,
            softmax_scale,
            window_size_left,
            window_size_right,
            self.sQ_layout,
            self.sK_layout,
            self.sV_layout,
            self.sO_layout,
            self.sP_layout,
            self.gmem_tiled_copy_Q,
            self.gmem_tiled_copy_K,
            self.gmem_tiled_copy_V,
            self.gmem_tiled_copy_O,
            tiled_mma_qk,
            tiled_mma_pv,
            SharedStorage,
            tile_sched_params,
            TileScheduler,
            aux_data,
            fastdiv_mods,
            mQSF,  # FP8
            mKSF,  # FP8
        ).launch(
            grid=grid_dim,
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

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
        softmax_scale_log2: Float32,
        softmax_scale: Optional[Float32],
        window_size_left: Optional[Int32],
        window_size_right: Optional[Int32],
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout | None,
        gmem_tiled_copy_Q: cute.TiledCopy,
        gmem_tiled_copy_K: cute.TiledCopy,
        gmem_tiled_copy_V: cute.TiledCopy,
        gmem_tiled_copy_O: cute.TiledCopy,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        tile_sched_params,
        TileScheduler: cutlass.Constexpr[Callable],
        aux_data: AuxData = AuxData(),
        fastdiv_mods=None,
        mQSF: Optional[cute.Tensor] = None,  # FP8
        mKSF: Optional[cute.Tensor] = None,  # FP8
    ):
        # Thread index, block index
        tidx, _, _ = cute.arch.thread_idx()

        tile_scheduler = TileScheduler.create(tile_sched_params)
        work_tile = tile_scheduler.initial_work_tile_info()

        if work_tile.is_valid_tile:
            m_block, num_head, batch_size, _ = work_tile.tile_idx

            block_info = BlockInfo(
                self.tile_m,
                self.tile_n,
                self.is_causal,
                self.is_local,
                False,  # is_split_kv
                window_size_left,
                window_size_right,
                qhead_per_kvhead_packgqa=self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,
            )
            seqlen = SeqlenInfoQK.create(
                batch_idx=batch_size,
                seqlen_q_static=mQ.shape[0] if const_expr(not self.pack_gqa) else mQ.shape[0][1],
                seqlen_k_static=mK.shape[0],
                mCuSeqlensQ=mCuSeqlensQ,
                mCuSeqlensK=mCuSeqlensK,
                mSeqUsedQ=mSeqUsedQ,
                mSeqUsedK=mSeqUsedK,
            )
            n_block_min, n_block_max = block_info.get_n_block_min_max(seqlen, m_block)
            # For varlen, wasted grid tiles (where batch_idx >= num_batch) will have
            # seqlen_q=seqlen_k=0 and n_block_max=0.  Clamp to 0 so we don't use a
            # negative block index for K/V loads; the load/store predicates already
            # guard all memory accesses when seqlen is 0.
            n_block = cutlass.max(n_block_max - 1, 0)

            # ///////////////////////////////////////////////////////////////////////////////
            # Get the appropriate tiles for this thread block.
            # ///////////////////////////////////////////////////////////////////////////////
            blkQ_shape = (self.tile_m, self.tile_hdim)
            blkK_shape = (self.tile_n, self.tile_hdim)
            blkV_shape = (self.tile_n, self.tile_hdimv)
            num_head_kv = num_head if const_expr(self.pack_gqa) else num_head // self.qhead_per_kvhead
            mQ_cur = seqlen.offset_batch_Q(mQ, batch_size, dim=3)[None, None, num_head]
            if const_expr(not seqlen.has_cu_seqlens_k):
                mK_cur = mK[None, None, num_head_kv, batch_size]
                mV_cur = mV[None, None, num_head_kv, batch_size]
            else:
                mK_cur = cute.domain_offset((seqlen.offset_k, 0), mK[None, None, num_head_kv])
                mV_cur = cute.domain_offset((seqlen.offset_k, 0), mV[None, None, num_head_kv])
            if const_expr(not self.pack_gqa):
                gQ = cute.local_tile(mQ_cur, blkQ_shape, (m_block, 0))
            gK = cute.local_tile(mK_cur, blkK_shape, (None, 0))
            gV = cute.local_tile(mV_cur, blkV_shape, (None, 0))

            # ///////////////////////////////////////////////////////////////////////////////
            # Get shared memory buffer
            # ///////////////////////////////////////////////////////////////////////////////
            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            sQ = storage.sQ.get_tensor(sQ_layout)  # FP8: e4m3 (padded: it also holds the start of sO)
            sK = storage.sK.get_tensor(sK_layout)
            sV = storage.sV.get_tensor(sV_layout)  # FP8: no Q_in_regs (asserted in __init__)
            # Transpose view of V to tensor with layout (head_dim_v, tile_n) for tiled mma
            sVt = layout_utils.transpose_view(sV)

            gmem_thr_copy_K = gmem_tiled_copy_K.get_slice(tidx)
            gmem_thr_copy_V = gmem_tiled_copy_V.get_slice(tidx)
            # (CPY_Atom, CPY_N, CPY_K, n_block)
            tKsK, tKgK = gmem_thr_copy_K.partition_D(sK), gmem_thr_copy_K.partition_S(gK)
            # (CPY_Atom, CPY_N, CPY_K, n_block)
            tVsV, tVgV = gmem_thr_copy_V.partition_D(sV), gmem_thr_copy_V.partition_S(gV)

            # ///////////////////////////////////////////////////////////////////////////////
            # Tile MMA compute thread partitions and allocate accumulators
            # ///////////////////////////////////////////////////////////////////////////////
            thr_mma_qk = tiled_mma_qk.get_slice(tidx)
            thr_mma_pv = tiled_mma_pv.get_slice(tidx)
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
            tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK[None, None, 0]))
            tOrVt = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sVt[None, None, 0]))
            acc_shape_O = thr_mma_pv.partition_shape_C((self.tile_m, self.tile_hdimv))
            acc_O = cute.make_rmem_tensor(acc_shape_O, Float32)
            acc_O.fill(0.0)

            # ///////////////////////////////////////////////////////////////////////////////
            # Smem copy atom tiling
            # ///////////////////////////////////////////////////////////////////////////////
            # FP8: ldmatrix.x4 (b16) on the e4m3 tiles: the DSL takes the 1-byte value type; each thread gets
            # 4 consecutive bytes of a 16-byte row, exactly the m16n8k32 A/B fragment register (4 K-consecutive e4m3)
            smem_copy_atom_QK = cute.make_copy_atom(
                warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4),
                self.qk_dtype,
            )
            smem_copy_atom_V = cute.make_copy_atom(
                warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4),
                self.dtype,
            )
            smem_thr_copy_Q = utils.make_tiled_copy_A(smem_copy_atom_QK, tiled_mma_qk).get_slice(tidx)
            smem_thr_copy_K = utils.make_tiled_copy_B(smem_copy_atom_QK, tiled_mma_qk).get_slice(tidx)
            smem_thr_copy_V = utils.make_tiled_copy_B(smem_copy_atom_V, tiled_mma_pv).get_slice(tidx)

            tSsQ = smem_thr_copy_Q.partition_S(sQ)
            tSsK = smem_thr_copy_K.partition_S(sK)
            tOsVt = smem_thr_copy_V.partition_S(sVt)

            # ///////////////////////////////////////////////////////////////////////////////
            # Predicate: Mark indices that need to copy when problem_shape isn't a multiple
            # of tile_shape
            # ///////////////////////////////////////////////////////////////////////////////
            # Construct identity layout for KV
            cK = cute.make_identity_tensor((self.tile_n, self.tile_hdim))
            tKcK = gmem_thr_copy_K.partition_S(cK)
            t0KcK = gmem_thr_copy_K.get_slice(0).partition_S(cK)
            # FP8: K's copy (16 e4m3 a thread) and V's (8 bf16 a thread) partition differently: never share
            cV = cute.make_identity_tensor((self.tile_n, self.tile_hdimv))
            tVcV = gmem_thr_copy_V.partition_S(cV)
            t0VcV = gmem_thr_copy_V.get_slice(0).partition_S(cV)
            # Allocate predicate tensors for m and n, here we only allocate the tile of k, and
            # use "if" on the mn dimension.
            # This is to reduce register pressure and gets 2-3% performance gain.
            tKpK = utils.predicate_k(tKcK, limit=mK.shape[1])
            tVpV = utils.predicate_k(tVcV, limit=mV.shape[1])  # FP8: see tVcV

            # shape: (atom_v_m * rest_m)
            softmax = Softmax.create(
                softmax_scale_log2,
                num_rows=acc_O.shape[0][0] * acc_O.shape[1],
                softmax_scale=softmax_scale,
            )
            softmax.reset()

            # group parameters for compute_one_n_block
            mma_params = SimpleNamespace(
                thr_mma_qk=thr_mma_qk,
                thr_mma_pv=thr_mma_pv,
                tSrQ=tSrQ,
                tSrK=tSrK,
                tOrVt=tOrVt,
                acc_O=acc_O,
            )
            smem_copy_params = SimpleNamespace(
                smem_thr_copy_Q=smem_thr_copy_Q,
                smem_thr_copy_K=smem_thr_copy_K,
                smem_thr_copy_V=smem_thr_copy_V,
                tSsQ=tSsQ,
                tSsK=tSsK,
                tOsVt=tOsVt,
            )
            load_K = partial(
                self.load_K, gmem_tiled_copy_K, tKgK, tKsK, tKcK, t0KcK, tKpK, seqlen=seqlen.seqlen_k
            )
            load_V = partial(
                self.load_V, gmem_tiled_copy_V, tVgV, tVsV, tVcV, t0VcV, tVpV, seqlen=seqlen.seqlen_k
            )

            # BS: ue8m0 scale factors for the block-scaled QK mma. mQSF (b, h, s_pad, d/32), mKSF (b, h_kv, s_pad, d/32),
            # rows padded to the tile (rows past seqlen are read but only feed masked / unstored S entries).
            # SFA (this CTA's Q rows) is loaded once from gmem into registers; SFB per n_block (compute_one_n_block).
            nsf = self.tile_hdim // 32
            assert mQSF is not None, "BS: the block-scaled variant needs mQSF / mKSF"
            if const_expr(not self.sf_packed):
                mQSF_cur = mQSF[batch_size, num_head, None, None]
                mKSF_cur = mKSF[batch_size, num_head_kv, None, None]
            else:
                mQSF_cur = mQSF[batch_size, num_head, None]
                mKSF_cur = mKSF[batch_size, num_head_kv, None]
            if const_expr(not self.sf_packed):
                gQSF = sf_broadcast_view(cute.local_tile(mQSF_cur, (self.tile_m, nsf), (m_block, 0)), self.tile_m, nsf)
                gKSF0 = sf_broadcast_view(cute.local_tile(mKSF_cur, (self.tile_n, nsf), (0, 0)), self.tile_n, nsf)
                k_atoms = nsf
            else:  # BS packed: mQSF (b, h, s_pad) u32 / u16 words, one per row
                gQSF = sf_word_view(cute.local_tile(mQSF_cur, (self.tile_m,), (m_block,)), self.tile_m)
                gKSF0 = sf_word_view(cute.local_tile(mKSF_cur, (self.tile_n,), (0,)), self.tile_n)
                k_atoms = 1
            tSrQSF = _sf_group_vmk(blackwell_helpers.partition_fragment_SFA(gQSF, thr_mma_qk, tidx), k_atoms)
            tSrKSF = _sf_group_vmk(blackwell_helpers.partition_fragment_SFB(gKSF0, thr_mma_qk, tidx), k_atoms)
            sf_thr_copy_Q = make_sf_thr_copy(tiled_mma_qk, "A", tidx, mQSF.element_type)
            sf_thr_copy_K = make_sf_thr_copy(tiled_mma_qk, "B", tidx, mQSF.element_type)
            copy_sf(sf_thr_copy_Q, gQSF, tSrQSF)
            if const_expr(self.print_sf_layouts):
                print("  BS: gQSF view", gQSF.layout, "tSrQSF", tSrQSF.layout, "tSrKSF", tSrKSF.layout,
                      "tSrQ", tSrQ.layout, "tSrK", tSrK.layout)
                print("  BS: SFA TV", blackwell_helpers.get_layoutSFA_TV(tiled_mma_qk), "SFB TV",
                      blackwell_helpers.get_layoutSFB_TV(tiled_mma_qk))
            sf_params = SimpleNamespace(tSrQSF=tSrQSF, tSrKSF=tSrKSF, sf_thr_copy_K=sf_thr_copy_K,
                                        mKSF_cur=mKSF_cur, nsf=nsf)

            compute_one_n_block = partial(
                self.compute_one_n_block,
                sf_params=sf_params,  # BS
                mma_params=mma_params,
                smem_copy_params=smem_copy_params,
                softmax=softmax,
                load_K=load_K,
                load_V=load_V,
                score_mod=self.score_mod,
                batch_idx=batch_size,
                head_idx=num_head,
                m_block=m_block,
                aux_data=aux_data,
                fastdiv_mods=fastdiv_mods,
            )

            # ///////////////////////////////////////////////////////////////////////////////
            # Prologue
            # ///////////////////////////////////////////////////////////////////////////////
            # Start async loads of the last mn-tile, where we take care of the mn residue
            gmem_thr_copy_Q = gmem_tiled_copy_Q.get_slice(tidx)
            if const_expr(not self.pack_gqa):
                self.load_Q(gmem_thr_copy_Q, gQ, sQ, m_block, seqlen=seqlen.seqlen_q, headdim=mQ.shape[1])
            else:
                pack_gqa = PackGQA(self.tile_m, self.tile_hdim, self.check_hdim_oob, self.qhead_per_kvhead)
                pack_gqa.load_Q(mQ_cur, sQ, gmem_tiled_copy_Q, tidx, m_block, seqlen.seqlen_q)
            cute.arch.cp_async_commit_group()

            def preprocess_Q():
                cute.arch.cp_async_wait_group(self.num_stages * 2 - 1)
                if const_expr(self.Q_in_regs):
                    cute.arch.barrier()
                    tSrQ_copy_view = smem_thr_copy_Q.retile(tSrQ)
                    cute.copy(smem_thr_copy_Q, tSsQ, tSrQ_copy_view)

            # If Q_in_regs, we load Q, then load 1 stage of K, then (optionally) rotate Q and
            # read from smem_q to registers, then load V.
            # If !Q_in_regs, we load Q, load all stages of K & V, then (optionally) rotate Q.
            if const_expr(self.Q_in_regs):
                load_K(n_block, smem_pipe_write=0, need_predicates=True)
                cute.arch.cp_async_commit_group()
                preprocess_Q()
                cute.arch.barrier()  # Make sure all threads have read smem_q before loading V

            for stage in cutlass.range_constexpr(self.num_stages):
                if const_expr(not self.Q_in_regs or stage > 0):
                    if stage == 0 or n_block - stage >= 0:
                        load_K(n_block - stage, smem_pipe_write=stage, need_predicates=stage == 0)
                    cute.arch.cp_async_commit_group()
                if const_expr(stage < self.num_stages - 1):
                    if stage == 0 or n_block - stage >= 0:
                        load_V(n_block - stage, smem_pipe_write=stage, need_predicates=stage == 0)
                    cute.arch.cp_async_commit_group()
            if const_expr(not self.Q_in_regs):
                preprocess_Q()

            # ///////////////////////////////////////////////////////////////////////////////
            # Mainloop
            # ///////////////////////////////////////////////////////////////////////////////
            # Start processing of the first n-block.
            # For performance reason, we separate out two kinds of iterations:
            # those that need masking on S, and those that don't.
            # We need masking on S for the very last block when K and V has length not multiple of tile_n.
            # We also need masking on S if it's causal, for the last several blocks.
            mask = AttentionMask(
                self.tile_m,
                self.tile_n,
                seqlen,
                window_size_left,
                window_size_right,
                self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,
            )
            mask_fn = partial(
                mask.apply_mask,
                batch_idx=batch_size,
                head_idx=num_head,
                m_block=m_block,
                thr_mma=thr_mma_qk,
                mask_causal=self.is_causal,
                mask_local=self.is_local,
                aux_data=aux_data,
                fastdiv_mods=fastdiv_mods if const_expr(self.mask_mod is not None) else None,
            )

            # First iteration with seqlen masking
            smem_pipe_read = Int32(0)
            smem_pipe_write = Int32(self.num_stages - 1)
            compute_one_n_block(
                n_block,
                smem_pipe_read,
                smem_pipe_write,
                is_first_n_block=True,
                seqlen=seqlen,
                mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True),
            )
            smem_pipe_read = self.advance_pipeline(smem_pipe_read)
            smem_pipe_write = self.advance_pipeline(smem_pipe_write)
            # Next couple of iterations with causal masking
            if const_expr(self.is_causal or self.is_local):
                n_block_min_causal_local_mask = block_info.get_n_block_min_causal_local_mask(
                    seqlen, m_block, n_block_min
                )
                for n_tile in cutlass.range(n_block_max - 1 - n_block_min_causal_local_mask, unroll=1):
                    n_block = n_block_max - 2 - n_tile
                    compute_one_n_block(
                        n_block,
                        smem_pipe_read,
                        smem_pipe_write,
                        seqlen=seqlen,
                        mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=True),
                    )
                    smem_pipe_read = self.advance_pipeline(smem_pipe_read)
                    smem_pipe_write = self.advance_pipeline(smem_pipe_write)
            # The remaining iterations have no masking
            for n_tile in cutlass.range(n_block, unroll=1):
                compute_one_n_block(
                    n_block - n_tile - 1, smem_pipe_read, smem_pipe_write,
                    seqlen=seqlen, is_first_n_block=False,
                    mask_fn=partial(mask_fn, mask_mod=self.mask_mod, mask_seqlen=False)
                )
                smem_pipe_read = self.advance_pipeline(smem_pipe_read)
                smem_pipe_write = self.advance_pipeline(smem_pipe_write)
            # TODO: local

            # normalize acc_O by row_sum and calculate the lse
            row_scale = softmax.finalize()
            softmax.rescale_O(acc_O, row_scale)

            # ///////////////////////////////////////////////////////////////////////////////
            # Epilogue
            # ///////////////////////////////////////////////////////////////////////////////
            # reuse sQ's data iterator
            # FP8: sO is bf16 over sQ's (fp8) address, spilling into sV (see _get_shared_storage_cls)
            sO = cute.make_tensor(cute.recast_ptr(sQ.iterator, dtype=self.dtype), sO_layout)
            self.epilogue(
                acc_O,
                softmax.row_sum,
                mO,
                mLSE,
                sO,
                seqlen,
                gmem_tiled_copy_O,
                None,
                tiled_mma_pv,
                tidx,
                m_block,
                num_head,
                batch_size,
            )

    @cute.jit
    def compute_one_n_block(
        self,
        n_block: Int32,
        smem_pipe_read: Int32,
        smem_pipe_write: Int32,
        mma_params: SimpleNamespace,
        smem_copy_params: SimpleNamespace,
        softmax: Softmax,
        load_K: Callable,
        load_V: Callable,
        score_mod: Callable | None,
        batch_idx: cutlass.Int32,
        head_idx: cutlass.Int32,
        m_block: cutlass.Int32,
        seqlen: SeqlenInfoQK,
        aux_data: AuxData = AuxData(),
        fastdiv_mods=None,
        mask_fn: Optional[Callable] = None,
        is_first_n_block: cutlass.Constexpr = False,
        check_inf: cutlass.Constexpr = True,
        sf_params: Optional[SimpleNamespace] = None,  # BS
    ):
        """Compute one n_block of S/O.

        This function provides different variants for processing the first n block versus
        subsequent blocks.
        """

        def sync():
            cute.arch.cp_async_wait_group(self.num_stages * 2 - 2)
            cute.arch.barrier()

        # BS: this K tile's ue8m0 scales, gmem -> registers, issued before the wait so the loads overlap it
        if const_expr(not self.sf_packed):
            gKSF = sf_broadcast_view(cute.local_tile(sf_params.mKSF_cur, (self.tile_n, sf_params.nsf), (n_block, 0)),
                                     self.tile_n, sf_params.nsf)
        else:
            gKSF = sf_word_view(cute.local_tile(sf_params.mKSF_cur, (self.tile_n,), (n_block,)), self.tile_n)
        copy_sf(sf_params.sf_thr_copy_K, gKSF, sf_params.tSrKSF)
        acc_shape_S = mma_params.thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        acc_S = cute.make_rmem_tensor(acc_shape_S, Float32)
        acc_S.fill(0.0)
        # wait for smem tile QK before mma calculation for S
        sync()

        # need predicates for the first tile
        def load_V_next():
            if self.num_stages == 1 or n_block - self.num_stages + 1 >= 0:
                load_V(
                    n_block - self.num_stages + 1,
                    smem_pipe_write,
                    need_predicates=is_first_n_block and self.num_stages == 1,
                )
            cute.arch.cp_async_commit_group()

        load_V_next()
        # BS: sm80_utils.gemm's ldmatrix / mma interleave, with the block-scaled atom's SF operands riding as
        # list operands: cute.gemm(mma, D, [A, SFA], [B, SFB], C), one (A, SFA) k-block slice per issue.
        tSsK_cur = smem_copy_params.tSsK[None, None, None, smem_pipe_read if const_expr(self.num_stages > 1) else 0]
        tSsQ = smem_copy_params.tSsQ
        tSrQ_cv = smem_copy_params.smem_thr_copy_Q.retile(mma_params.tSrQ)
        tSrK_cv = smem_copy_params.smem_thr_copy_K.retile(mma_params.tSrK)
        cute.copy(smem_copy_params.smem_thr_copy_Q, tSsQ[None, None, 0], tSrQ_cv[None, None, 0])
        cute.copy(smem_copy_params.smem_thr_copy_K, tSsK_cur[None, None, 0], tSrK_cv[None, None, 0])
        for k in cutlass.range_constexpr(cute.size(tSsQ.shape[2])):
            if k < cute.size(tSsQ.shape[2]) - 1:
                cute.copy(smem_copy_params.smem_thr_copy_Q, tSsQ[None, None, k + 1], tSrQ_cv[None, None, k + 1])
                cute.copy(smem_copy_params.smem_thr_copy_K, tSsK_cur[None, None, k + 1], tSrK_cv[None, None, k + 1])
            if const_expr(not self.sf_packed):
                cute.gemm(
                    mma_params.thr_mma_qk,
                    acc_S,
                    [mma_params.tSrQ[None, None, k], sf_params.tSrQSF[None, None, k]],
                    [mma_params.tSrK[None, None, k], sf_params.tSrKSF[None, None, k]],
                    acc_S,
                )
            else:
                # BS packed: the SF fragments are compact bytes (m * nsf + k), (n * nsf + k) (see the printed
                # layouts): view each MN atom's nsf bytes as one u16 / u32 and select k-block k by byte-id.
                # the word fragments (V, MN, 1) hold one u32 / u16 per MN atom (V broadcast): compact along MN
                n_m = cute.size(mma_params.tSrQ, mode=[1])
                n_n = cute.size(mma_params.tSrK, mode=[1])
                qsf = cute.make_tensor(sf_params.tSrQSF.iterator, cute.make_layout(n_m))
                ksf = cute.make_tensor(sf_params.tSrKSF.iterator, cute.make_layout(n_n))
                for n in cutlass.range_constexpr(n_n):  # n outer, m inner (as cute.gemm's (V,M)x(V,N) issue order)
                    b = cute.recast_tensor(mma_params.tSrK[None, n, k], Uint32)
                    for m in cutlass.range_constexpr(n_m):
                        a = cute.recast_tensor(mma_params.tSrQ[None, m, k], Uint32)
                        acc = acc_S[None, m, n]
                        out = mma_mxf8_packed_sf([acc[i] for i in range(4)], [a[i] for i in range(4)],
                                                 [b[i] for i in range(2)], [acc[i] for i in range(4)],
                                                 Uint32(qsf[m]), Uint32(ksf[n]), k)
                        for i in cutlass.range_constexpr(4):
                            acc[i] = out[i]
        # FP8: dequantize S = (Q_q K_q^T) * q_scale[m_block] * k_scale[n_block] before mask / softmax. The acc
        # of m16n8k32 has m16n8k16's C layout (checked), so the mask, the softmax and the P conversion below are
        # upstream's unchanged.
        if const_expr(score_mod is not None):
            self.apply_score_mod(
                mma_params.thr_mma_qk,
                batch_idx,
                head_idx,
                m_block,
                acc_S,
                n_block,
                softmax_scale=softmax.softmax_scale,
                seqlen=seqlen,
                aux_data=aux_data,
                fastdiv_mods=fastdiv_mods,
            )

        smem_pipe_write = self.advance_pipeline(smem_pipe_write)

        def load_K_next():
            if n_block - self.num_stages >= 0:
                load_K(n_block - self.num_stages, smem_pipe_write, need_predicates=False)
            cute.arch.cp_async_commit_group()

        # wait for smem tile V for O
        if const_expr(self.num_stages == 1):
            sync()
            load_K_next()
        if const_expr(mask_fn is not None):
            mask_fn(acc_S, n_block=n_block)
        row_scale = softmax.online_softmax(acc_S, is_first=is_first_n_block, check_inf=check_inf)
        softmax.rescale_O(mma_params.acc_O, row_scale)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        tOrP = layout_utils.reshape_acc_to_frgA(rP)
        if const_expr(self.num_stages > 1):
            sync()
            load_K_next()
        sm80_utils.gemm_rs(
            mma_params.thr_mma_pv,
            mma_params.acc_O,
            tOrP,
            mma_params.tOrVt,
            smem_copy_params.tOsVt[
                None, None, None, smem_pipe_read if const_expr(self.num_stages > 1) else 0
            ],
            smem_copy_params.smem_thr_copy_V,
            # hook_fn=load_K_next,
        )
        # if const_expr(self.num_stages > 1):
        #     load_K_next()


# ----------------------------------------------------------------------------------------------------------------
# CPU quantization reference (for the later GPU check): per-tile e4m3 with scale = amax / 448.
# ----------------------------------------------------------------------------------------------------------------


def quantize_per_tile(x, tile: int):
    """x: (b, s, h, d) float tensor. Returns (x_e4m3 (b, s, h, d) float8_e4m3fn, scale (b, h, ceil(s/tile)) fp32)
    with x ~= x_e4m3 * scale[b, h, row // tile]; scale = amax(|tile|) / 448 (1 for an all-zero tile)."""
    import torch

    b, s, h, d = x.shape
    blocks = -(-s // tile)
    pad = blocks * tile - s
    xp = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad))  # pad seqlen with zeros
    xt = xp.view(b, blocks, tile, h, d)
    amax = xt.abs().amax(dim=(2, 4))  # (b, blocks, h)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (xt / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(b, blocks * tile, h, d)[:, :s].contiguous(), scale.permute(0, 2, 1).contiguous()


def dequantize_per_tile(xq, scale, tile: int):
    b, s, h, d = xq.shape
    rows = scale.permute(0, 2, 1).repeat_interleave(tile, dim=1)[:, :s]  # (b, s, h)
    return xq.float() * rows[..., None]


def reference_attention(q, k, v, softmax_scale, causal, qh_per_kvh=1):
    """fp32 attention on (b, s, h, d) tensors (k / v with h_kv heads); returns (out (b, s, h, dv), lse (b, h, s))."""
    import torch

    k = k.repeat_interleave(qh_per_kvh, dim=2)
    v = v.repeat_interleave(qh_per_kvh, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * softmax_scale
    if causal:  # bottom-right aligned, as FA
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(diagonal=sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.float())
    return out, lse


def reference_selftest():
    """Quantize random Q / K per tile, check the dequantized attention against the unquantized one (CPU)."""
    import torch

    torch.manual_seed(0)
    b, s, h, d, tm, tn = 1, 512, 2, 128, 128, 64
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    qq, qs = quantize_per_tile(q, tm)
    kq, ks = quantize_per_tile(k, tn)
    scale = 1 / math.sqrt(d)
    for causal in (False, True):
        out_ref, lse_ref = reference_attention(q, k, v, scale, causal)
        out_q, lse_q = reference_attention(dequantize_per_tile(qq, qs, tm), dequantize_per_tile(kq, ks, tn), v, scale, causal)
        print(f"  reference selftest causal={causal}: max|dO| fp8-vs-fp32 {(out_q - out_ref).abs().max():.4f}, "
              f"max|dLSE| {(lse_q - lse_ref).abs().max():.4f}, q_scale {tuple(qs.shape)}, k_scale {tuple(ks.shape)}")


# ----------------------------------------------------------------------------------------------------------------
# Fake-tensor compile for sm_120a and the cubin's facts.
# ----------------------------------------------------------------------------------------------------------------


def sass_census(cubin: bytes) -> dict:
    """SASS of the cubin (the triton wheel's cuobjdump): MMA kinds, ldmatrix, local-memory traffic."""
    import re
    import subprocess
    from pathlib import Path

    from fa4tune.cubin import local_traffic_bytes, tool_path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([str(tool_path("cuobjdump")), "-sass", str(path)], capture_output=True, text=True,
                              check=True).stdout
    mma = {}
    for op in re.findall(r"\b([HQO]MMA(?:\.[A-Z0-9]+)*)\b", sass):
        mma[op] = mma.get(op, 0) + 1
    stores, loads = local_traffic_bytes(sass)
    return dict(mma=mma, ldsm=len(re.findall(r"\bLDSM\b", sass)), ldsm_t=len(re.findall(r"\bLDSM\.16\.MT88", sass)),
                stl=stores, ldl=loads, sass=sass)


def compile_one(fp8: bool, d: int, tile_m: int, tile_n: int, stages: int, causal: bool, threads: int = 128,
                b: int = 1, s: int = 4096, h: int = 16, h_kv: int = 16, scales: bool = True):
    import time

    from quack.compile_utils import make_fake_tensor

    from fa4tune.cubin import read_cubin

    bf = cutlass.BFloat16
    qk = Float8E4M3FN if fp8 else bf
    div_qk, div_v = 128 // qk.width, 128 // bf.width  # 16-byte aligned strides
    mQ = make_fake_tensor(qk, (b, s, h, d), divisibility=div_qk)
    mK = make_fake_tensor(qk, (b, s, h_kv, d), divisibility=div_qk)
    mV = make_fake_tensor(bf, (b, s, h_kv, d), divisibility=div_v)
    mO = make_fake_tensor(bf, (b, s, h, d), divisibility=div_v)
    mLSE = make_fake_tensor(Float32, (b, h, s), divisibility=1)
    cls = FlashAttentionForwardSm120Fp8 if fp8 else FlashAttentionForwardSm120
    fa = cls(bf, d, d, h // h_kv, is_causal=causal, pack_gqa=False, tile_m=tile_m, tile_n=tile_n,
             num_stages=stages, num_threads=threads)
    kwargs = {}
    if fp8 and scales:
        s_pad = -(-s // max(tile_m, tile_n)) * max(tile_m, tile_n)  # BS: SF rows padded to the tile
        kwargs = dict(mQSF=make_fake_tensor(Float8E8M0FNU, (b, h, s_pad, d // 32), divisibility=1),
                      mKSF=make_fake_tensor(Float8E8M0FNU, (b, h_kv, s_pad, d // 32), divisibility=1))
        if os.environ.get("BS_PACKED", "0") == "1":  # BS packed: the same bytes as (b, h, s_pad) words
            word = cutlass.Uint32 if d // 32 == 4 else cutlass.Uint16
            kwargs = dict(mQSF=make_fake_tensor(word, (b, h, s_pad), divisibility=1),
                          mKSF=make_fake_tensor(word, (b, h_kv, s_pad), divisibility=1))
    t0 = time.perf_counter()
    fn = cute.compile(fa, mQ, mK, mV, mO, mLSE, Float32(1.0 / math.sqrt(d)), **kwargs,
                      stream=cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    seconds = time.perf_counter() - t0
    facts = read_cubin(fn.__cubin__)
    census = sass_census(fn.__cubin__)
    smem = getattr(fa, "smem_bytes_traced", None)
    if smem is None:  # upstream: the same struct it launches with
        smem = int(fa._get_shared_storage_cls_size) if hasattr(fa, "_get_shared_storage_cls_size") else None
    return dict(regs=facts.registers, stack=facts.stack_bytes, spill_st=census["stl"], spill_ld=census["ldl"],
                smem=smem, static_smem=facts.static_smem_bytes, mma=census["mma"], ldsm=census["ldsm"],
                ldsm_t=census["ldsm_t"], seconds=seconds, sass=census["sass"])


def _record_upstream_smem():
    """Upstream's SharedStorage size, recorded when its kernel is traced (as fa4tune.fake_compile does)."""
    from flash_attn.cute.flash_fwd import FlashAttentionForwardSm80

    own = FlashAttentionForwardSm80._get_shared_storage_cls

    def wrapped(self):
        storage = own(self)
        self._get_shared_storage_cls_size = int(storage.size_in_bytes())
        return storage

    FlashAttentionForwardSm80._get_shared_storage_cls = wrapped


@cute.jit
def _print_mma_layouts(warps: cutlass.Constexpr[int]):
    bf = cute.make_tiled_mma(warp.MmaF16BF16Op(cutlass.BFloat16, Float32, (16, 8, 16)), (warps, 1, 1),
                             permutation_mnk=(warps * 16, 16, 16))
    f8 = cute.make_tiled_mma(warp.MmaFP8Op(Float8E4M3FN, Float32, (16, 8, 32)), (warps, 1, 1),
                             permutation_mnk=(warps * 16, 16, 32))
    print("  C (S acc) TV layout, bf16 m16n8k16:", bf.tv_layout_C_tiled)
    print("  C (S acc) TV layout, e4m3 m16n8k32:", f8.tv_layout_C_tiled)
    print("  S acc per thread for 128x64: bf16", bf.get_slice(0).partition_shape_C((128, 64)),
          " e4m3", f8.get_slice(0).partition_shape_C((128, 64)))
    print("  A TV layout, e4m3 m16n8k32:", f8.tv_layout_A_tiled)
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), Float8E4M3FN)
    print("  ldmatrix.x4 atom on e4m3, dst TV:", atom.layout_dst_tv if hasattr(atom, "layout_dst_tv") else atom)
    print("  ldmatrix tiled copy A (e4m3) TV:", cute.make_tiled_copy_A(atom, f8).layout_tv_tiled
          if hasattr(cute.make_tiled_copy_A(atom, f8), "layout_tv_tiled") else "")


def _bank_conflict_ways(row_bytes: int, bits: int, base: int, shift: int) -> int:
    """Worst bank-conflict degree of ldmatrix phases (8 consecutive rows, one 16-byte chunk column) on a 1-byte
    K-major tile of `row_bytes`-byte rows under Swizzle<bits, base, shift> (plain Python model)."""
    def swz(x):
        return x ^ ((x & (((1 << bits) - 1) << (base + shift))) >> shift) if bits else x
    worst = 1
    for r0 in range(0, 64, 8):
        for c in range(row_bytes // 16):
            count = {}
            for r in range(r0, r0 + 8):
                a = swz(r * row_bytes + c * 16)
                for w in range(4):
                    count[(a // 4 + w) % 32] = count.get((a // 4 + w) % 32, 0) + 1
            worst = max(worst, max(count.values()))
    return worst


def check_layouts():
    print("layout checks (trace time):")
    _print_mma_layouts(4)
    for row_bytes, ours, upstream in ((128, (3, 4, 3), (4, 4, 4)), (64, (2, 4, 3), (3, 4, 4))):
        print(f"  e4m3 smem rows of {row_bytes} B: ldmatrix bank-conflict ways, this atom Swizzle{ours}: "
              f"{_bank_conflict_ways(row_bytes, *ours)}; upstream get_smem_layout_atom(Float8) Swizzle{upstream}: "
              f"{_bank_conflict_ways(row_bytes, *upstream)}")


def mma_counts(r: dict) -> tuple[int, int]:
    qmma = sum(n for op, n in r["mma"].items() if op.startswith(("QMMA", "OMMA")))  # BS: any 8-bit MMA
    hmma = sum(n for op, n in r["mma"].items() if op.startswith("HMMA"))
    return qmma, hmma


def main(argv=None):
    import argparse
    import traceback

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="one config only")
    p.add_argument("--bs", action="store_true", help="BS: the block-scaled variant's 4 configs")
    p.add_argument("--no-baseline", action="store_true", help="skip upstream bf16 compiles")
    p.add_argument("--ref", action="store_true", help="run the CPU quantization reference self-test")
    p.add_argument("--sass", default="", help="write the first fp8 config's SASS to this path")
    args = p.parse_args(argv)
    _record_upstream_smem()
    check_layouts()
    if args.ref:
        reference_selftest()
    configs = [(d, tn, st, c, True) for d in (128, 64) for tn in (64, 128) for st in (1, 2) for c in (False, True)]
    configs = configs[:1] if args.quick else configs + [(128, 64, 1, False, False), (128, 64, 1, True, False)]
    if args.bs:  # BS: the brief's configs: d 128 / 64, tile 128x64, 1 stage, causal and not
        configs = [(d, 64, 1, c, True) for d in (128, 64) for c in (False, True)]
    print("sm_120a, fake tensors b=1 s=4096 h=16, tile_m=128, 128 threads. spill = STL+LDL bytes in the SASS; smem = the "
          "launch's dynamic shared memory (SharedStorage); QMMA = e4m3 m16n8k32, HMMA = bf16 m16n8k16, LDSM = ldmatrix "
          "x4 (non-trans: Q/K, .MT88 trans: V) SASS instruction counts. bf16 = upstream FlashAttentionForwardSm120 "
          "(same tiles). SM120 allows 101376 B (99 KB) of dynamic smem per CTA.")
    hdr = (f"{'d':>3} {'tn':>3} {'st':>2} {'causal':>6} {'scales':>6} | {'fp8':>4} {'regs':>4} {'spill':>9} {'smem':>6} "
           f"{'QMMA':>4} {'HMMA':>4} {'LDSM':>4} {'LDSMT':>5} | {'bf16':>4} {'regs':>4} {'spill':>9} {'smem':>6} {'HMMA':>4}")
    print(hdr)
    print("-" * len(hdr))
    for i, (d, tn, st, causal, scales) in enumerate(configs):
        line = f"{d:>3} {tn:>3} {st:>2} {str(causal):>6} {str(scales):>6} | "
        try:
            r = compile_one(True, d, 128, tn, st, causal, scales=scales)
            if args.sass and i == 0:
                open(args.sass, "w").write(r["sass"])
            qmma, hmma = mma_counts(r)
            fits = "ok" if r["smem"] <= 101376 else "big"
            line += (f"{fits:>4} {r['regs']:>4} {str(r['spill_st']) + '+' + str(r['spill_ld']):>9} {r['smem']:>6} "
                     f"{qmma:>4} {hmma:>4} {r['ldsm'] - r['ldsm_t']:>4} {r['ldsm_t']:>5} | ")
        except Exception as err:
            traceback.print_exc()
            line += f"FAIL {type(err).__name__}: {str(err)[:80]} | "
        if not args.no_baseline and scales:
            try:
                r = compile_one(False, d, 128, tn, st, causal)
                fits = "ok" if r["smem"] <= 101376 else "big"
                line += (f"{fits:>4} {r['regs']:>4} {str(r['spill_st']) + '+' + str(r['spill_ld']):>9} {r['smem']:>6} "
                         f"{mma_counts(r)[1]:>4}")
            except Exception as err:
                line += f"FAIL {type(err).__name__}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
