"""FP8 forward for SM120 (kernel "sm120_fp8", issue 45): S = Q K^T on e4m3 mma.sync (m16n8k32, SASS QMMA.16832 on
sm_120a), P V, the softmax and the accumulators as upstream's SM80-path code has them (bf16 V and O, fp32 LSE).

Q and K arrive in e4m3 with one fp32 dequantization scale per tile of rows and head: q_scale (batch, heads,
ceil(seqlen_q / tile_m)), k_scale (batch, kv heads, ceil(seqlen_k / tile_n)); the kernel multiplies each S tile
by q_scale * k_scale before the softmax. fa4tune.fp8.attention_fp8 is the host path (K smoothed, Q and K quantized
per tile, the LSE corrected). FP8 is opt-in: the class declares `quantizes`, so it runs the "fp8" problem classes
(bf16 inputs, a suite's dtype "fp8") and no other, and no other class runs those (fa4tune.feasibility: fp8_opt_in,
fp8_kernel); fa4tune.api routes its configs to fa4tune.fp8.

The kernel is the prototype of docs/measurements/2026-12-06-fp8-forward-prototype.md, every change against
upstream's flash_fwd.py (FlashAttentionForwardSm80, 4.0.0b36) marked `# FP8:`; on an H100 it passed 8/8 against
fp32 on dequantized inputs and 36/36 under the FP8 gate on the standard prefill shapes
(docs/measurements/2026-12-06-h100-fp16-fix-studies-fp8.md section 4). Its shared storage: sQ (e4m3, padded so that
sQ + sV hold the bf16 O tile the epilogue stages through sQ's address), sV (bf16, per stage), sK (e4m3, per stage),
each aligned to 1024 B: `smem_bytes`, which tests/test_fp8_kernel.py checks against the compiled struct.
"""

# No `from __future__ import annotations` here: the CuTe DSL reads annotations at run time.
import math
from functools import partial
from types import SimpleNamespace
from typing import Callable, Optional, Type

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float8E4M3FN, Int32, const_expr
from cutlass.base_dsl.arch import Arch
from cutlass.cute.nvgpu import cpasync, warp
from quack import layout_utils

from flash_attn.cute import ampere_helpers as sm80_utils
from flash_attn.cute import utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.pack_gqa import PackGQA, pack_gqa_layout
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.tile_scheduler import SingleTileScheduler, SingleTileVarlenScheduler, TileSchedulerArguments
from flash_attn.cute.utils import AuxData

from fa4tune.feasibility import Verdict
from fa4tune.kernel_class import Limits
from kernels.tuned_forward_sm120 import TILE_ALIGN, TunedForwardSm120, round_up

FP8_TILE_DIM = 32  # m16n8k32 steps the head dim by 32: the padded head dim must be a multiple of it


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


def vt_copy_cols(tile_n: int) -> int:
    """FP8 PV: the 16-byte chunks of one V^T row (tile_n e4m3 keys) a row of copying threads covers: the largest of
    8, 4, 2, 1 that divides the row's chunks."""
    return next(c for c in (8, 4, 2, 1) if (tile_n // 16) % c == 0)


def fp8_tiled_mma(dtype: Type[cutlass.Numeric], warps: int) -> cute.TiledMma:
    """FP8: e4m3 mma.sync m16n8k32 (SASS QMMA.16832) tiled as upstream's SM80 P V: `warps` warps along M, N
    permuted to 16 (one ldmatrix.x4 of the B operand covers two n8 atoms), K by the atom's 32. S = Q K^T takes it;
    with pv_fp8 P V too (N over head_dim_v, K over the tile's keys)."""
    return cute.make_tiled_mma(warp.MmaFP8Op(dtype, Float32, (16, 8, 32)), (warps, 1, 1),
                               permutation_mnk=(warps * 16, 16, 32))


def fp8_ldmatrix_atom(dtype: Type[cutlass.Numeric]) -> cute.CopyAtom:
    """FP8: ldmatrix.x4 (b16) on K-major e4m3 tiles (Q, K; V^T with pv_fp8): the DSL takes the 1-byte value type;
    each thread gets 4 consecutive bytes of a 16-byte row, exactly an m16n8k32 A/B register (4 K-consecutive e4m3)."""
    return cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)


def vt_smem_layout(tile_hdimv: int, tile_n: int, stages: int) -> cute.ComposedLayout:
    """FP8 PV: V^T's stages in shared memory, (head_dim_v, tile_n, stages), keys contiguous, the e4m3 swizzle atom of
    a tile_n-byte row (as K's with the head dim)."""
    return cute.tile_to_shape(fp8_smem_layout_atom(tile_n), (tile_hdimv, tile_n, stages), (0, 1, 2))


def vt_gmem_tiled_copy(dtype: Type[cutlass.Numeric], num_threads: int, tile_n: int) -> cute.TiledCopy:
    """FP8 PV: V^T's global -> shared copy: 16-byte cp.async, rows of vt_copy_cols(tile_n) threads."""
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128)
    cols = vt_copy_cols(tile_n)
    return cute.make_tiled_copy_tv(atom, cute.make_ordered_layout((num_threads // cols, cols), order=(1, 0)),
                                   cute.make_layout((1, 128 // dtype.width)))


PV_P_SCALE = 448.0  # FP8 PV: P <= 1 times the largest e4m3 value, so P's small values keep their mantissa


def pv_frgA_layout(rP: cute.Tensor) -> cute.Layout:
    """FP8 PV: m16n8k32's A fragment ((4, 2, 2), MMA_M, MMA_N / 4) of P, as a map from A's coordinates to the index
    (value, then m, then n8 tile: colexicographic) of the S MMA's C fragment (4, MMA_M, MMA_N) that holds the value,
    in fa4tune.fp8.pv_key_order (V^T's keys follow it): A's value (k = i within 4, row half r, k half h) is C's
    (column c, row half r) of n8 tile j = 4 kb + i // 2 + 2 h, i = c + 2 (j mod 2). For a compact C fragment the
    index is the register offset. Only the shape of `rP` is read."""
    m, n = cute.size(rP.shape[1]), cute.size(rP.shape[2])
    return cute.make_layout((((2, 2), 2, 2), m, n // 4), stride=(((1, 4 * m), 2, 8 * m), 4, 16 * m))


def pv_p_fragment(acc_S: cute.Tensor, dtype: Type[cutlass.Numeric]) -> cute.Tensor:
    """FP8 PV: P (the fp32 S accumulator after the online softmax) x PV_P_SCALE in `dtype` (e4m3), a compact A
    fragment ((4, 2, 2), MMA_M, MMA_N / 4) of m16n8k32 whose values are in A's order (pv_frgA_layout).

    cute.gemm builds an e4m3 A operand's four 32-bit registers from the fragment's storage in order (bytes 4 x .. 4 x
    + 3 of each (m, k-block) slice are register a_x, lowest byte first), not from a permuted view of it: the PTX of
    a view over the e4m3 registers in C's order (the first version: make_tensor(rP.iterator, pv_frgA_layout(rP)))
    fed a0 = tile 0's (row g: c0, c1; row g + 8: c0, c1), half of it from the wrong row and keys. So the gather is
    done here on the fp32 registers (a renaming, no instruction) before the cast: each cvt.rn.satfinite.e4m3x2.f32
    packs a (c0, c1) pair of one row and n8 tile, two of them one A register, as many instructions as before.
    tests/test_fp8_kernel.py checks this on the PTX of a one-warp kernel built with this function."""
    view = cute.make_tensor(acc_S.iterator, cute.composition(acc_S.layout, pv_frgA_layout(acc_S)))
    tOrP = cute.make_rmem_tensor(view.shape, dtype)
    tOrP.store((view.load() * Float32(PV_P_SCALE)).to(dtype))
    return tOrP


def fp8_tile_bytes(rows: int, head_dim: int, stages: int, bytes_per_element: int) -> int:
    """A tile's bytes in this class's shared storage: rows x head dim (padded to 32) x stages, aligned to 1024 B."""
    return round_up(rows * round_up(head_dim, FP8_TILE_DIM) * stages * bytes_per_element, TILE_ALIGN)


class Fp8ForwardSm120(TunedForwardSm120):
    """SM120 forward with e4m3 Q/K (QMMA m16n8k32 for S = QK^T), bf16 V/O, per-tile dequant scales."""

    name = "sm120_fp8"
    upstream = None  # a kernel of its own: export does not write it into upstream's interface
    varlen = False
    quantizes = True  # bf16 inputs, S in e4m3: the fp8 classes run it, no other class does (fa4tune.feasibility)
    limits = Limits(num_stages=(1, 2), head_dim=(32, 128))  # the prototype's compiled and GPU-checked range
    knobs = {"pv_fp8": (False, True)}  # P V on e4m3 mma.sync too (V^T quantized per channel by the host)

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """sQ (e4m3, at least the bf16 O tile less sV's bytes), sV (bf16, per stage; e4m3 V^T with pv_fp8), sK
        (e4m3, per stage)."""
        pv_fp8 = config.extra_knobs.get("pv_fp8", False)
        v = fp8_tile_bytes(config.tile_n, problem_class.head_dim_v, config.num_stages, 1 if pv_fp8 else 2)
        o = config.tile_m * round_up(problem_class.head_dim_v, FP8_TILE_DIM) * 2
        q = max(fp8_tile_bytes(config.tile_m, problem_class.head_dim, 1, 1), round_up(max(o - v, 0), TILE_ALIGN))
        k = fp8_tile_bytes(config.tile_n, problem_class.head_dim, config.num_stages, 1)
        return q + v + k, f"Q {q} (e4m3; with V it holds the bf16 O tile) + V {v}{' (e4m3 V^T)' if pv_fp8 else ''} + K {k} (e4m3)"

    @classmethod
    def can_implement(cls, config, problem_class, target) -> Verdict:
        """The kernel's own rules: Q in shared memory, the head dim a multiple of 32, upstream's SM80 ones."""
        if config.Q_in_regs:
            return Verdict(False, "fp8_no_Q_in_regs", "sm120_fp8 keeps Q in shared memory (sV aliasing the e4m3 sQ is not built)")
        if problem_class.head_dim % FP8_TILE_DIM:
            return Verdict(False, "fp8_head_dim_multiple_of_32",
                           f"e4m3 mma.sync m16n8k32 steps the head dim by 32, got head_dim={problem_class.head_dim}")
        if config.extra_knobs.get("pv_fp8", False):
            if problem_class.head_dim_v % FP8_TILE_DIM or config.tile_n % FP8_TILE_DIM:
                return Verdict(False, "fp8_pv_multiple_of_32", "pv_fp8: m16n8k32 steps the keys by 32 and V^T's rows "
                               f"by 16: tile_n and head_dim_v must be multiples of 32, got {config.tile_n}, {problem_class.head_dim_v}")
            rows = config.num_threads // vt_copy_cols(config.tile_n)
            if problem_class.head_dim_v % rows:
                return Verdict(False, "fp8_pv_copy", f"pv_fp8: V^T's copy covers {rows} rows of head_dim_v per pass "
                               f"({config.num_threads} threads, {vt_copy_cols(config.tile_n)} 16-byte chunks a row), "
                               f"head_dim_v={problem_class.head_dim_v} is not a multiple")
        return super().can_implement(config, problem_class, target)

    def __init__(self, *args, qk_dtype: Type[cutlass.Numeric] = Float8E4M3FN, pv_fp8: bool = False, **kwargs):
        super().__init__(*args, **kwargs)  # `dtype` (first arg) stays the V / O / P type (bf16)
        self.qk_dtype = qk_dtype  # FP8: the Q / K type
        self.pv_fp8 = pv_fp8  # FP8 PV: P (x 448) and V^T (per channel) in e4m3, O scaled back in the epilogue
        assert not self.Q_in_regs, "FP8 prototype: Q_in_regs (sV aliasing the fp8 sQ) is not supported"
        # FP8: m16n8k32 steps K by 32: the padded head dim must be a multiple of 32 (32, 64, 96, 128, 192, 256)
        assert self.tile_hdim % 32 == 0, f"FP8: head_dim must pad to a multiple of 32, got {self.tile_hdim}"
        assert self.score_mod is None, "FP8 prototype: score_mod not wired (it would see the dequantized S; untested)"
        self.smem_bytes_traced = None  # the SharedStorage struct's size, recorded at trace time

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
        if const_expr(self.pv_fp8):  # FP8 PV: V^T (head_dim_v x tile_n, keys contiguous) in e4m3, K-major as K is
            self.sV_layout = vt_smem_layout(self.tile_hdimv, self.tile_n, self.num_stages)
            self.gmem_tiled_copy_V = vt_gmem_tiled_copy(self.qk_dtype, self.num_producer_threads, self.tile_n)

    # FP8: S = Q K^T on mma.sync.m16n8k32.e4m3.e4m3.f32 (SASS QMMA.16832); P V stays bf16 m16n8k16.
    # Same warp tiling as upstream (num_threads/32 warps along M, N permuted to 16 so one ldmatrix.x4 of K
    # covers two n8 atoms); the K permutation is the atom's 32.
    def _get_tiled_mma(self):
        _, tiled_mma_pv = super()._get_tiled_mma()
        warps = self.num_threads // 32
        tiled_mma_qk = fp8_tiled_mma(self.qk_dtype, warps)
        if const_expr(self.pv_fp8):  # FP8 PV: the same tiling, N over head_dim_v, K over the tile's keys
            tiled_mma_pv = fp8_tiled_mma(self.qk_dtype, warps)
        return tiled_mma_qk, tiled_mma_pv

    # FP8: sQ / sK are 1-byte ranges. The epilogue stages O (bf16, tile_m * dv * 2 bytes) through sQ's address,
    # which is now half that size: sQ comes first and sV right after, and sQ is padded so that sQ + sV hold O
    # (the epilogue's barrier already orders it after every thread's last read of V, as upstream's Q_in_regs
    # aliasing of sV and sO relies on). sK stays out of the way.
    def _get_shared_storage_cls(self):
        cosize_Q, cosize_K, cosize_V, cosize_O = [
            cute.cosize(layout) for layout in (self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout)]
        v_dtype = self.qk_dtype if const_expr(self.pv_fp8) else self.dtype
        bytes_V = cosize_V * v_dtype.width // 8
        bytes_O = cosize_O * self.dtype.width // 8
        elems_Q = max(cosize_Q, (bytes_O - bytes_V) * 8 // self.qk_dtype.width)
        sQ_struct = cute.struct.Align[cute.struct.MemRange[self.qk_dtype, elems_Q], 1024]
        sV_struct = cute.struct.Align[cute.struct.MemRange[v_dtype, cosize_V], 1024]
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
        mQScale: Optional[cute.Tensor] = None,  # FP8: (batch, num_head, m_blocks) fp32 dequant scale of Q tiles
        mKScale: Optional[cute.Tensor] = None,  # FP8: (batch, num_head_kv, n_blocks) fp32 dequant scale of K tiles
        mVt: Optional[cute.Tensor] = None,  # FP8 PV: (batch, num_head_kv, head_dim_v, seqlen_k padded) e4m3 V^T
        mVScale: Optional[cute.Tensor] = None,  # FP8 PV: (batch, num_head_kv, head_dim_v) fp32 per-channel scale
        # Always keep stream as the last parameter (EnvStream: obtained implicitly via TVM FFI).
        stream: cuda.CUstream = None,
    ):
        """Configures and launches the flash attention kernel.

        mQ/mK/mV/mO has same data types(supports fp16 and bf16) and same layout:
        (batch_size, seqlen_q, num_head, head_dim):(_, _, _, 1)
        """
        assert learnable_sink is None, "Learnable sink is not supported in this kernel"
        # FP8: per-tile scales index (batch, head, block) of the non-varlen layout
        assert (mQScale is None) == (mKScale is None), "FP8: pass both q_scale and k_scale, or neither"
        assert self.pv_fp8 == (mVt is not None) == (mVScale is not None), "FP8 PV: pv_fp8 takes V^T and its scales"
        if const_expr(mQScale is not None):
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
        if const_expr(mVt is not None):
            mVt = assume_tensor_aligned(mVt)  # FP8 PV: 16-byte rows (the keys padded to whole tiles)
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
            mQScale,  # FP8
            mKScale,  # FP8
            mVt,  # FP8 PV
            mVScale,  # FP8 PV
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
        mQScale: Optional[cute.Tensor] = None,  # FP8
        mKScale: Optional[cute.Tensor] = None,  # FP8
        mVt: Optional[cute.Tensor] = None,  # FP8 PV
        mVScale: Optional[cute.Tensor] = None,  # FP8 PV
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
            if const_expr(self.pv_fp8):  # FP8 PV: (head_dim_v, tile_n, n_block) of V^T, keys contiguous
                gV = cute.local_tile(mVt[batch_size, num_head_kv, None, None], (self.tile_hdimv, self.tile_n), (0, None))
            else:
                gV = cute.local_tile(mV_cur, blkV_shape, (None, 0))

            # ///////////////////////////////////////////////////////////////////////////////
            # Get shared memory buffer
            # ///////////////////////////////////////////////////////////////////////////////
            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            sQ = storage.sQ.get_tensor(sQ_layout)  # FP8: e4m3 (padded: it also holds the start of sO)
            sK = storage.sK.get_tensor(sK_layout)
            sV = storage.sV.get_tensor(sV_layout)  # FP8: no Q_in_regs (asserted in __init__)
            # Transpose view of V to tensor with layout (head_dim_v, tile_n) for tiled mma (FP8 PV: sV is V^T)
            sVt = sV if const_expr(self.pv_fp8) else layout_utils.transpose_view(sV)

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
            smem_copy_atom_QK = fp8_ldmatrix_atom(self.qk_dtype)
            smem_copy_atom_V = cute.make_copy_atom(
                warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4),
                self.dtype,
            )
            smem_thr_copy_Q = utils.make_tiled_copy_A(smem_copy_atom_QK, tiled_mma_qk).get_slice(tidx)
            smem_thr_copy_K = utils.make_tiled_copy_B(smem_copy_atom_QK, tiled_mma_qk).get_slice(tidx)
            if const_expr(self.pv_fp8):  # FP8 PV: V^T is K-major e4m3, read as K is
                smem_copy_atom_V = smem_copy_atom_QK
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
            # Allocate predicate tensors for m and n, here we only allocate the tile of k, and
            # use "if" on the mn dimension.
            # This is to reduce register pressure and gets 2-3% performance gain.
            tKpK = utils.predicate_k(tKcK, limit=mK.shape[1])
            if const_expr(not self.pv_fp8):  # FP8 PV: V^T's tiles are whole (load_Vt)
                cV = cute.make_identity_tensor((self.tile_n, self.tile_hdimv))
                tVcV = gmem_thr_copy_V.partition_S(cV)
                t0VcV = gmem_thr_copy_V.get_slice(0).partition_S(cV)
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
            if const_expr(self.pv_fp8):  # FP8 PV: V^T padded to whole tiles by the host: no predicates
                load_V = partial(self.load_Vt, gmem_tiled_copy_V, tVgV, tVsV)
            else:
                load_V = partial(
                    self.load_V, gmem_tiled_copy_V, tVgV, tVsV, tVcV, t0VcV, tVpV, seqlen=seqlen.seqlen_k
                )

            # FP8: this CTA's Q-tile scale (one scalar) and its (b, h_kv) row of K-tile scales
            q_scale = Float32(1.0)
            mKScale_cur = None
            if const_expr(mQScale is not None):
                q_scale = mQScale[batch_size, num_head, m_block]
                mKScale_cur = mKScale[batch_size, num_head_kv, None]

            compute_one_n_block = partial(
                self.compute_one_n_block,
                q_scale=q_scale,  # FP8
                mKScale_cur=mKScale_cur,  # FP8
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

            if const_expr(self.pv_fp8):  # FP8 PV: O's columns back from P x 448 and V^T's per-channel scale
                mVScale_cur = mVScale[batch_size, num_head_kv, None]
                tOcO = thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_hdimv)))
                for i in cutlass.range_constexpr(cute.size(acc_O)):
                    acc_O[i] = acc_O[i] * (mVScale_cur[tOcO[i][1]] * Float32(1.0 / PV_P_SCALE))
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
    def load_Vt(self, gmem_tiled_copy: cute.TiledCopy, tVgV: cute.Tensor, tVsV: cute.Tensor, block: Int32,
                smem_pipe_write: Int32, need_predicates: cutlass.Constexpr = False):
        """FP8 PV: one (head_dim_v, tile_n) tile of V^T into its stage; whole tiles (the host pads the keys)."""
        cute.copy(gmem_tiled_copy, tVgV[None, None, None, block],
                  tVsV[None, None, None, smem_pipe_write if const_expr(self.num_stages > 1) else 0])

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
        q_scale: Float32 = Float32(1.0),  # FP8
        mKScale_cur: Optional[cute.Tensor] = None,  # FP8
    ):
        """Compute one n_block of S/O.

        This function provides different variants for processing the first n block versus
        subsequent blocks.
        """

        def sync():
            cute.arch.cp_async_wait_group(self.num_stages * 2 - 2)
            cute.arch.barrier()

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
        if const_expr(mKScale_cur is not None):
            tile_scale = q_scale * mKScale_cur[n_block]  # FP8: issued before the gemm so the load is hidden
        sm80_utils.gemm(
            mma_params.thr_mma_qk,
            acc_S,
            mma_params.tSrQ,
            mma_params.tSrK,
            smem_copy_params.tSsQ,
            smem_copy_params.tSsK[
                None, None, None, smem_pipe_read if const_expr(self.num_stages > 1) else 0
            ],
            smem_copy_params.smem_thr_copy_Q,
            smem_copy_params.smem_thr_copy_K,
            # hook_fn=load_V_next,
            A_in_regs=self.Q_in_regs,
        )
        # FP8: dequantize S = (Q_q K_q^T) * q_scale[m_block] * k_scale[n_block] before mask / softmax. The acc
        # of m16n8k32 has m16n8k16's C layout (checked), so the mask, the softmax and the P conversion below are
        # upstream's unchanged.
        if const_expr(mKScale_cur is not None):
            acc_S.store(acc_S.load() * tile_scale)
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
        if const_expr(self.pv_fp8):  # FP8 PV: P x 448 in e4m3, gathered into A's order before the cast
            tOrP = pv_p_fragment(acc_S, self.qk_dtype)
        else:
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
