"""A one-kernel decode (kernel "sm120_decode_cluster"): a cluster of 8 CTAs per KV head, K and V streamed through
registers, the merge on chip. bench/decode_cluster_cuda.py's `mma` prototype, written in the CuTe DSL.

Why: issue #13's b1 4K GQA decode asks 10x upstream's SM120 path, which no two-kernel decode reaches here (a second
launch alone costs 2.2-5 µs, docs/measurements/2026-12-04-h200-decode-prototypes.md) and which upstream's SM80 layout
(16 query rows per warp, K and V through shared memory) cannot read fast enough from 64 CTAs. This class:

- one cluster of CLUSTER CTAs per (batch, KV head); CTA r walks keys [r L, (r + 1) L), L = ceil(seqlen_k / CLUSTER);
- 8 warps; each owns 64 keys of a 512-key tile, four groups of 16: K and V of groups 0-1 and K of group 2 in
  registers (160 per thread), V of group 2 and K, V of group 3 by cp.async in shared memory (12 KB per warp, 96 KB):
  a tile's 256 KB are requested at once, and a one-tile-deep pipeline refills each group as soon as it is consumed;
- the keys are the MMA's M: S^T = K Q^T with mma.sync m16n8k16 (the query rows, GQA-packed, are N: up to 8), then
  O^T = V^T P^T; both A operands come straight from the loaded registers, in layouts chosen for it (the head-dim
  order of QK's k-steps and the output columns of PV's m-tiles are permuted, see `attend16`), P^T's B operand from
  four shuffles of S^T's accumulators;
- an online softmax per warp (log2 domain), the 8 warps merged in shared memory, the cluster's CTAs through
  distributed shared memory, each CTA finalizing 16 of the 128 output columns; split 0 writes the LSE.

Scope (named rules before any compile): one query token (seqlen_q 1, the decode step; causal is then the same as
non-causal, bottom-right aligned), head_dim = head_dim_v = 128, bf16, qhead_per_kvhead <= 8, 256 threads, 1 stage.
The knobs tile_m / tile_n are the keys of one MMA group (16, the MMA's M) and the keys per warp and tile (64).

Measured (SM120 kernels emulated on NVIDIA H200, docs/measurements/2026-12-04-h200-decode-cluster.md): correct on the
gate, 24-80 % slower than the split-KV entry on every decode (19 µs against 15-16 at b1 4K). The road's own floor,
the reads and the cluster merge with no math (bench/decode_cluster_cuda.py's floors), is 12.2-12.7 µs there.
"""

# No `from __future__ import annotations` here: the CuTe DSL reads annotations at run time.
import math
from types import SimpleNamespace
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.utils import AuxData

from fa4tune.feasibility import OK, Verdict
from fa4tune.kernel_class import Limits
from kernels.tuned_forward_sm120 import TunedForwardSm120

CLUSTER = 8  # CTAs per (batch, KV head): the portable cluster size
WARPS = 8
KEYS_PER_WARP = 64  # per tile: four groups of 16 keys (tile_n)
ROWS = 8  # the MMA's N: GQA-packed query rows
GROUP = 16  # keys per MMA group, the MMA's M (tile_m)
HEAD_DIM = 128
TILE_KEYS = WARPS * KEYS_PER_WARP  # keys of one CTA per tile
STAGE_BYTES = 3 * 8 * 32 * 16  # per warp: V of group 2, K and V of group 3; 8 uint4 per lane each
PAIR_LO, PAIR_HI = 0x5410, 0x7632  # prmt selectors: {a.lo, b.lo} and {a.hi, b.hi} of two 32-bit words
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


def _asm(result, operands, text: str, constraints: str, loc=None, ip=None):
    return llvm.inline_asm(result, operands, text, constraints, has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


def _volatile_asm(result, operands, text: str, constraints: str, loc=None, ip=None):
    return llvm.inline_asm(result, operands, text, constraints, has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


def _u32x4(struct, loc=None, ip=None) -> list:
    return [Uint32(llvm.extractvalue(T.i32(), struct, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_global_v4(address: Int64, *, loc=None, ip=None) -> list:
    """ld.global.nc.v4.u32: 16 bytes at a global address, read-only path; volatile, so that every load of a tile is
    issued where the code puts it (before the tile's math)."""
    struct = _volatile_asm(llvm.StructType.get_literal([T.i32()] * 4), [Int64(address).ir_value(loc=loc, ip=ip)],
                           "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", loc, ip)
    return _u32x4(struct, loc, ip)


@dsl_user_op
def ld_shared_v4(address: Int32, *, loc=None, ip=None) -> list:
    """ld.shared.v4.u32 at a 32-bit shared address (volatile: it stays after the cp.async wait that fills it)."""
    struct = _volatile_asm(llvm.StructType.get_literal([T.i32()] * 4), [Int32(address).ir_value(loc=loc, ip=ip)],
                           "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", loc, ip)
    return _u32x4(struct, loc, ip)


@dsl_user_op
def st_shared_v4(address: Int32, words: list, *, loc=None, ip=None) -> None:
    _volatile_asm(None, [Int32(address).ir_value(loc=loc, ip=ip)] + [Uint32(w).ir_value(loc=loc, ip=ip) for w in words],
                  "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", loc, ip)


@dsl_user_op
def cp_async_16(smem_address: Int32, global_address: Int64, *, loc=None, ip=None) -> None:
    """cp.async.cg 16 bytes, global -> shared (L2 only)."""
    _volatile_asm(None, [Int32(smem_address).ir_value(loc=loc, ip=ip), Int64(global_address).ir_value(loc=loc, ip=ip)],
                  "cp.async.cg.shared.global [$0], [$1], 16;", "r,l", loc, ip)


@dsl_user_op
def byte_perm(a: Uint32, b: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """prmt.b32: bytes of {b, a} picked by the selector's nibbles (as CUDA's __byte_perm)."""
    return Uint32(_asm(T.i32(), [Uint32(a).ir_value(loc=loc, ip=ip), Uint32(b).ir_value(loc=loc, ip=ip),
                                 Int32(selector).ir_value(loc=loc, ip=ip)], "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
                       loc, ip))


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None) -> Uint32:
    """Two fp32 rounded to bf16, `lo` in the low half."""
    return Uint32(_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
                       "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", loc, ip))


@dsl_user_op
def mma_bf16_16816(c: list, a: list, b: list, *, loc=None, ip=None) -> list:
    """mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: c (4 fp32) += A (4 regs) x B (2 regs)."""
    operands = [Uint32(x).ir_value(loc=loc, ip=ip) for x in a + b] + [Float32(x).ir_value(loc=loc, ip=ip) for x in c]
    struct = _asm(llvm.StructType.get_literal([T.f32()] * 4), operands,
                  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, "
                  "{$10, $11, $12, $13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), struct, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def load_cluster_f32(smem_address: Int32, cta_rank, *, loc=None, ip=None) -> Float32:
    """The fp32 at this shared address in the cluster's CTA `cta_rank` (mapa + ld.shared::cluster, volatile: after
    the cluster barrier that makes it visible)."""
    remote = _asm(T.i32(), [Int32(smem_address).ir_value(loc=loc, ip=ip), Int32(cta_rank).ir_value(loc=loc, ip=ip)],
                  "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", loc, ip)
    return Float32(_volatile_asm(T.f32(), [remote], "ld.shared::cluster.f32 $0, [$1];", "=f,r", loc, ip))


# The kernel's trace-time helpers (the DSL allows no closures over a kernel's values inside its staged loops): `c`
# holds the thread's values (a SimpleNamespace made by the kernel); a source is ("regs", slot) or ("smem", tensor).
def _key_k(c, grp, i):
    """The key of K's uint4 i (i = 2 s + e): key g or g + 8 of the group."""
    return grp * GROUP + c.g + 8 * (i & 1)


def _key_v(c, grp, i):
    """The key of V's uint4 i (i = 2 slot + hh): keys 2t, 2t+1, 2t+8, 2t+9 of the group."""
    return grp * GROUP + 2 * c.t + ((i >> 1) & 1) + 8 * (i >> 2)


def _k_col(c, i):
    """The byte offset in its row of K's uint4 i: head-dim columns 32 s + 8 t .. + 8 (i = 2 s + e)."""
    return (4 * (i >> 1) + c.t) * 16


def _v_col(c, i):
    """The byte offset in its row of V's uint4 i: columns 16 g + 8 hh .. + 8 (i = 2 slot + hh)."""
    return (2 * c.g + (i & 1)) * 16


def _q_col(c, s):
    """The byte offset in Q's row of the B registers of k-steps 2 s and 2 s + 1: as K's uint4 2 s."""
    return _k_col(c, 2 * s)


def _qk_operands(ka, kb, qs, j):
    """k-step 2 s + j's A registers (a0-a3) from K's uint4s 2 s (key g) and 2 s + 1 (key g + 8), B from Q's."""
    return [ka[2 * j], kb[2 * j], ka[2 * j + 1], kb[2 * j + 1]], [qs[2 * j], qs[2 * j + 1]]


def _p_sources(c):
    """The lanes whose S^T accumulators hold P[query g][keys 2t, 2t + 8] and P[query g][keys 2t + 1, 2t + 9]."""
    return 4 * (2 * c.t) + c.g // 2, 4 * (2 * c.t + 1) + c.g // 2


def _p_operands(w1, w2, perm):
    """P^T's B registers from {P[g][2t], P[g][2t + 8]} and {P[g][2t + 1], P[g][2t + 9]}."""
    return [perm(w1, w2, PAIR_LO), perm(w1, w2, PAIR_HI)]


def _pv_operands(s0, s1, s2, s3, wi, perm):
    """m-tile 4 hh + wi's A registers from word wi of V's uint4s of keys 2t, 2t + 1, 2t + 8, 2t + 9 (half hh)."""
    return [perm(s0[wi], s1[wi], PAIR_LO), perm(s0[wi], s1[wi], PAIR_HI),
            perm(s2[wi], s3[wi], PAIR_LO), perm(s2[wi], s3[wi], PAIR_HI)]


def _o_cols(c, mu):
    """The output columns of accumulators (mu, 0-1) and (mu, 2-3): 16 g + 2 mu and 16 g + 2 mu + 1."""
    return 16 * c.g + 2 * mu, 16 * c.g + 2 * mu + 1


def _k_address(c, key0, grp, i):
    key = cutlass.min(key0 + _key_k(c, grp, i), c.last_key)  # clamped: a key past the CTA's range is masked
    return c.k_head + Int64(key) * c.k_row + _k_col(c, i)


def _v_address(c, key0, grp, i):
    key = cutlass.min(key0 + _key_v(c, grp, i), c.last_key)
    return c.v_head + Int64(key) * c.v_row + _v_col(c, i)


def _load_regs(c, slot_k, slot_v, grp, key0):
    for i in range(8):
        words = ld_global_v4(_k_address(c, key0, grp, i))
        for j in range(4):
            c.regs[slot_k, i, j] = words[j]
        if slot_v is not None:
            words = ld_global_v4(_v_address(c, key0, grp, i))
            for j in range(4):
                c.regs[slot_v, i, j] = words[j]


def _stage_address(c, tensor, i):
    return c.stage_base + ((tensor * 8 + i) * 32 + c.lane) * 16


def _stage_v2(c, key0):
    for i in range(8):
        cp_async_16(_stage_address(c, 0, i), _v_address(c, key0, 2, i))


def _stage_kv3(c, key0):
    for i in range(8):
        cp_async_16(_stage_address(c, 1, i), _k_address(c, key0, 3, i))
        cp_async_16(_stage_address(c, 2, i), _v_address(c, key0, 3, i))


def _fetch(c, source, i):
    kind, n = source
    if kind == "regs":
        return [c.regs[n, i, j] for j in range(4)]
    return ld_shared_v4(_stage_address(c, n, i))


def _q_words(c, s):
    """Q's B registers for k-steps 2s, 2s+1: row g's columns 32 s + 8 t .. + 8 (rows past G hold zeros)."""
    return ld_shared_v4(c.q_base + c.g * HEAD_DIM * 2 + _q_col(c, s))


def _attend16(c, k_source, v_source, key0):
    """One group of 16 keys (key0 + 0..15) for thread (g, t) = (lane / 4, lane % 4):
    - S^T = K Q^T, 8 k-steps: k-step 2s + j's A registers are words {2j, 2j+1} of K's uint4 2s (key g; a0, a2) and
      2s + 1 (key g + 8; a1, a3); Q's B registers the same words of row g's uint4 s. QK^T sums over the head dim, so
      this order of its columns is as good as any. The accumulators: S[key g, g + 8][query 2t, 2t + 1].
    - the online softmax of queries 2t, 2t + 1 over the group (keys past kend masked), log2 domain;
    - P^T's B registers {P[query g][key 2t, 2t + 1]}, {P[query g][key 2t + 8, 2t + 9]} from lanes 4 (2t) + g / 2 and
      4 (2t + 1) + g / 2 (four shuffles and two byte permutes);
    - O^T += V^T P^T, 8 m-tiles: m-tile mu's rows g and g + 8 are output columns 16 g + 2 mu and 16 g + 2 mu + 1,
      so its A registers are byte-permuted pairs of the thread's own V words (keys 2t, 2t+1, 2t+8, 2t+9), and the
      accumulators hold O[query 2t, 2t + 1][columns 16 g .. 16 g + 16).
    (The algebra is checked in tests/test_decode_cluster_layout.py.)"""
    acc, ml = c.acc, c.ml
    s_acc = [Float32(0.0)] * 4
    for s in range(4):
        ka, kb, qs = _fetch(c, k_source, 2 * s), _fetch(c, k_source, 2 * s + 1), _q_words(c, s)
        for j in range(2):
            s_acc = mma_bf16_16816(s_acc, *_qk_operands(ka, kb, qs, j))
    lo_ok = key0 + c.g < c.kend  # s_acc[0], [1]: key g; [2], [3]: key g + 8
    hi_ok = key0 + c.g + 8 < c.kend
    sc = [cutlass.select_(lo_ok if i < 2 else hi_ok, s_acc[i] * c.scale_log2, -Float32.inf) for i in range(4)]
    mx = [cute.arch.fmax(sc[0], sc[2]), cute.arch.fmax(sc[1], sc[3])]  # queries 2t, 2t + 1
    for shift in range(3):
        mx = [cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, 4 << shift)) for x in mx]
    m_new = [cute.arch.fmax(ml[q], mx[q]) for q in range(2)]
    m_use = [cutlass.select_(m_new[q] == -Float32.inf, Float32(0.0), m_new[q]) for q in range(2)]
    alpha = [cute.math.exp2(ml[q] - m_use[q], fastmath=True) for q in range(2)]
    p = [cute.math.exp2(sc[i] - m_use[i % 2], fastmath=True) for i in range(4)]
    for q in range(2):
        ml[q] = m_new[q]
        ml[2 + q] = ml[2 + q] * alpha[q] + p[q] + p[2 + q]
    for mu in range(8):
        for i in range(4):
            acc[mu, i] = acc[mu, i] * alpha[i % 2]
    x = pack_bf16x2(p[0], p[2])  # {P[2t][key g], P[2t][key g + 8]}
    y = pack_bf16x2(p[1], p[3])  # the same for query 2t + 1
    src1, src2 = _p_sources(c)
    odd = (c.g % 2) == 1  # query g is the odd one of its source lane's pair
    w1 = cutlass.select_(odd, cute.arch.shuffle_sync(y, src1), cute.arch.shuffle_sync(x, src1))
    w2 = cutlass.select_(odd, cute.arch.shuffle_sync(y, src2), cute.arch.shuffle_sync(x, src2))
    b = _p_operands(w1, w2, byte_perm)
    for hh in range(2):
        s0, s1, s2, s3 = (_fetch(c, v_source, 2 * slot + hh) for slot in range(4))
        for wi in range(4):
            mu = 4 * hh + wi
            out = mma_bf16_16816([acc[mu, i] for i in range(4)], _pv_operands(s0, s1, s2, s3, wi, byte_perm), b)
            for i in range(4):
                acc[mu, i] = out[i]


class DecodeClusterForwardSm120(TunedForwardSm120):
    """One kernel per decode step: a cluster of 8 CTAs per KV head, K and V through registers, the merge on chip."""

    name = "sm120_decode_cluster"
    # correct on the gate and 24-80 % slower than the split-KV entry on every decode (H200, emulated:
    # docs/measurements/2026-12-04-h200-decode-cluster.md), so the search does not draw it
    searched = False
    limits = Limits(num_stages=(1,), num_threads=(WARPS * 32,), head_dim=(HEAD_DIM, HEAD_DIM), causal=True,
                    gqa=True, seqlen_q=(1, 1))

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """The warps' cp.async stages and Q's rows (the CTA's partial reuses warp 0's stage at the end)."""
        stages = WARPS * STAGE_BYTES
        q = ROWS * HEAD_DIM * 2
        return stages + q, f"stages {WARPS} warps x {STAGE_BYTES} + Q {ROWS} rows x {HEAD_DIM * 2}"

    @classmethod
    def can_implement(cls, config, problem_class, target) -> Verdict:
        if (config.tile_m, config.tile_n) != (GROUP, KEYS_PER_WARP) or config.Q_in_regs:
            return Verdict(False, "decode_cluster_tile",
                           f"sm120_decode_cluster runs tile_m={GROUP} (keys per MMA group), tile_n={KEYS_PER_WARP} (keys per warp "
                           f"and tile), Q_in_regs=False; got tile_m={config.tile_m}, tile_n={config.tile_n}, "
                           f"Q_in_regs={config.Q_in_regs}")
        if problem_class.qhead_per_kvhead > ROWS:
            return Verdict(False, "decode_cluster_query_rows",
                           f"sm120_decode_cluster packs at most {ROWS} query heads per KV head (the MMA's N), got "
                           f"qhead_per_kvhead={problem_class.qhead_per_kvhead}")
        if problem_class.dtype != "bf16":
            return Verdict(False, "decode_cluster_dtype", f"sm120_decode_cluster runs bf16, got {problem_class.dtype}")
        return OK

    @classmethod
    def static_problem(cls, problem_class):
        """The static check's shape: a 4K decode step (the class runs one query token)."""
        from fa4tune.config import Problem

        return Problem(1, 1, 4096, 8 * problem_class.qhead_per_kvhead, 8, problem_class.head_dim,
                       problem_class.head_dim_v, problem_class.causal, problem_class.dtype)

    def _get_shared_storage_cls(self):
        stage_struct = cute.struct.MemRange[Uint32, WARPS * STAGE_BYTES // 4]
        q_struct = cute.struct.MemRange[Uint32, ROWS * HEAD_DIM * 2 // 4]

        @cute.struct
        class SharedStorage:
            stage: stage_struct
            q: q_struct

        return SharedStorage

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
        """(batch, seqlen, heads, dim) tensors as upstream's host path passes them; a grid of (CLUSTER, KV heads,
        batch) in clusters of CLUSTER."""
        assert mCuSeqlensQ is None and mCuSeqlensK is None and mSeqUsedQ is None and mSeqUsedK is None, \
            "sm120_decode_cluster runs fixed-length batches"
        assert mPageTable is None and learnable_sink is None, "sm120_decode_cluster: no paged KV, no sink"
        self._check_type(*(t.element_type if t is not None else None for t in (mQ, mK, mV, mO, mLSE, None, None, None, None)))
        SharedStorage = self._get_shared_storage_cls()
        heads_kv = cute.size(mK.shape[2])
        batch = cute.size(mK.shape[0])
        self.kernel(mQ, mK, mV, mO, mLSE, Float32(softmax_scale * LOG2_E), SharedStorage).launch(
            grid=[CLUSTER, heads_kv, batch], block=[WARPS * 32, 1, 1], cluster=[CLUSTER, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: Optional[cute.Tensor],
               scale_log2: Float32, SharedStorage: cutlass.Constexpr):
        G = self.qhead_per_kvhead
        tidx, _, _ = cute.arch.thread_idx()
        rank, head_kv, batch = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        t = lane % 4
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage, byte_alignment=16)
        stage_base = storage.stage.data_ptr().toint() + warp * STAGE_BYTES  # this warp's [V2, K3, V3][8][32 lanes] uint4
        q_base = storage.q.data_ptr().toint()

        seqlen_k = mK.shape[1]
        per_cta = (seqlen_k + CLUSTER - 1) // CLUSTER
        kbeg = rank * per_cta
        kend = cutlass.min(seqlen_k, kbeg + per_cta)
        tiles = Int32(0)
        if kend > kbeg:
            tiles = (kend - kbeg + TILE_KEYS - 1) // TILE_KEYS
        last_key = cutlass.max(kend - 1, 0)

        # byte addresses: K and V rows of this (batch, KV head); a key's row at + key * row_bytes
        elem = 2
        k_row = Int64(mK.stride[1]) * elem
        v_row = Int64(mV.stride[1]) * elem
        k_head = mK.iterator.toint() + (Int64(batch) * mK.stride[0] + Int64(head_kv) * mK.stride[2]) * elem
        v_head = mV.iterator.toint() + (Int64(batch) * mV.stride[0] + Int64(head_kv) * mV.stride[2]) * elem

        # Q's G rows (query heads head_kv * G ..) into shared memory, 16 uint4 per row, and zeros in rows G..ROWS-1
        if tidx < ROWS * (HEAD_DIM // 8):
            row = tidx // (HEAD_DIM // 8)
            chunk = tidx % (HEAD_DIM // 8)
            words = [Uint32(0)] * 4
            if row < G:
                q_addr = mQ.iterator.toint() + (Int64(batch) * mQ.stride[0] + Int64(head_kv * G + row) * mQ.stride[2]) * elem + chunk * 16
                words = ld_global_v4(q_addr)
            st_shared_v4(q_base + tidx * 16, words)
        cute.arch.barrier()

        acc = cute.make_rmem_tensor((8, 4), Float32)
        acc.fill(0.0)
        ml = cute.make_rmem_tensor((4,), Float32)  # m (queries 2t, 2t+1), then l
        ml[0] = -Float32.inf
        ml[1] = -Float32.inf
        ml[2] = 0.0
        ml[3] = 0.0
        regs = cute.make_rmem_tensor((5, 8, 4), Uint32)  # K0, V0, K1, V1, K2: uint4 i of the group, per thread

        c = SimpleNamespace(regs=regs, acc=acc, ml=ml, lane=lane, g=g, t=t, G=G, kend=kend, last_key=last_key,
                            k_head=k_head, v_head=v_head, k_row=k_row, v_row=v_row, stage_base=stage_base,
                            q_base=q_base, scale_log2=scale_log2)
        tile_base = kbeg + warp * KEYS_PER_WARP
        if tiles > 0:
            _load_regs(c, 0, 1, 0, tile_base)
            _load_regs(c, 2, 3, 1, tile_base)
            _load_regs(c, 4, None, 2, tile_base)
            _stage_v2(c, tile_base)
            cute.arch.cp_async_commit_group()
            _stage_kv3(c, tile_base)
            cute.arch.cp_async_commit_group()
        for tile in cutlass.range(tiles, unroll=1):
            key0 = tile_base + tile * TILE_KEYS
            next0 = key0 + TILE_KEYS
            more = tile + 1 < tiles
            _attend16(c, ("regs", 0), ("regs", 1), key0)
            if more:
                _load_regs(c, 0, 1, 0, next0)
            _attend16(c, ("regs", 2), ("regs", 3), key0 + 16)
            if more:
                _load_regs(c, 2, 3, 1, next0)
            cute.arch.cp_async_wait_group(1)  # this tile's V2
            _attend16(c, ("regs", 4), ("smem", 0), key0 + 32)
            if more:
                _load_regs(c, 4, None, 2, next0)
                _stage_v2(c, next0)
            cute.arch.cp_async_commit_group()  # (empty on the last tile: one group per step)
            cute.arch.cp_async_wait_group(1)  # this tile's K3, V3
            _attend16(c, ("smem", 1), ("smem", 2), key0 + 48)
            if more:
                _stage_kv3(c, next0)
            cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)

        # the warp's row sums (m is the same in every lane), then its partial into its own stage
        for q in cutlass.range_constexpr(2):
            for mask in cutlass.range_constexpr(3):
                ml[2 + q] = ml[2 + q] + cute.arch.shuffle_sync_bfly(ml[2 + q], 4 << mask)
        cute.arch.sync_warp()  # every lane is done reading the stage that the partial overlays
        wpart = cute.make_tensor(cute.recast_ptr(storage.stage.data_ptr() + warp * (STAGE_BYTES // 4), dtype=Float32),
                                 cute.make_layout(ROWS * HEAD_DIM + 2 * ROWS))  # O [ROWS][D], m[ROWS], l[ROWS]
        for q in cutlass.range_constexpr(2):
            row = 2 * t + q
            if row < G:
                for mu in cutlass.range_constexpr(8):
                    col0, col1 = _o_cols(c, mu)
                    wpart[row * HEAD_DIM + col0] = acc[mu, q]
                    wpart[row * HEAD_DIM + col1] = acc[mu, 2 + q]
                if g == 0:
                    wpart[ROWS * HEAD_DIM + row] = ml[q]
                    wpart[ROWS * HEAD_DIM + ROWS + row] = ml[2 + q]
        cute.arch.barrier()

        # the CTA's partial, in the second half of warp 0's stage: O [G][D], M[G], L[G]
        stride = STAGE_BYTES // 4
        words = cute.make_tensor(cute.recast_ptr(storage.stage.data_ptr(), dtype=Float32),
                                 cute.make_layout(WARPS * stride))
        cpart_offset = (ROWS * HEAD_DIM + 2 * ROWS + 31) // 32 * 32
        for i in cutlass.range_constexpr(-(-(ROWS * HEAD_DIM) // (WARPS * 32))):
            idx = tidx + i * WARPS * 32
            row = idx // HEAD_DIM
            col = idx % HEAD_DIM
            if row < G:
                m_cta = -Float32.inf
                for w in cutlass.range_constexpr(WARPS):
                    m_cta = cute.arch.fmax(m_cta, words[w * stride + ROWS * HEAD_DIM + row])
                m_cta_use = cutlass.select_(m_cta == -Float32.inf, Float32(0.0), m_cta)
                o = Float32(0.0)
                l_cta = Float32(0.0)
                for w in cutlass.range_constexpr(WARPS):
                    weight = cute.math.exp2(words[w * stride + ROWS * HEAD_DIM + row] - m_cta_use, fastmath=True)
                    o += words[w * stride + row * HEAD_DIM + col] * weight
                    l_cta += words[w * stride + ROWS * HEAD_DIM + ROWS + row] * weight
                words[cpart_offset + row * HEAD_DIM + col] = o
                if col == 0:
                    words[cpart_offset + ROWS * HEAD_DIM + row] = m_cta
                    words[cpart_offset + ROWS * HEAD_DIM + ROWS + row] = l_cta
        cute.arch.cluster_arrive()  # release: this CTA's partial is visible to the cluster
        cute.arch.cluster_wait()

        # this CTA finalizes output columns [rank * 16, rank * 16 + 16) of the G rows from all the cluster's partials:
        # every remote value is loaded at once, the CTA arrives on the cluster barrier as soon as they are used, and
        # stores its slice while the slowest CTA finishes (the wait keeps its shared memory alive until then)
        cols = HEAD_DIM // CLUSTER
        cpart_address = storage.stage.data_ptr().toint() + cpart_offset * 4
        row = tidx // cols
        col = rank * cols + tidx % cols
        mine = tidx < ROWS * cols and row < G
        row_c = cutlass.min(row, ROWS - 1)  # (a thread that is not `mine` reads a harmless address)
        m_r = [load_cluster_f32(cpart_address + (ROWS * HEAD_DIM + row_c) * 4, r) for r in range(CLUSTER)]
        o_r = [load_cluster_f32(cpart_address + (row_c * HEAD_DIM + col) * 4, r) for r in range(CLUSTER)]
        l_r = [load_cluster_f32(cpart_address + (ROWS * HEAD_DIM + ROWS + row_c) * 4, r) for r in range(CLUSTER)]
        m_all = m_r[0]
        for r in cutlass.range_constexpr(1, CLUSTER):
            m_all = cute.arch.fmax(m_all, m_r[r])
        m_all_use = cutlass.select_(m_all == -Float32.inf, Float32(0.0), m_all)
        o = Float32(0.0)
        l_all = Float32(0.0)
        for r in cutlass.range_constexpr(CLUSTER):
            weight = cute.math.exp2(m_r[r] - m_all_use, fastmath=True)
            o += o_r[r] * weight
            l_all += l_r[r] * weight
        cute.arch.cluster_arrive()  # done reading the others' shared memory
        if mine:
            inv = Float32(0.0)
            if l_all > 0.0:
                inv = 1.0 / l_all
            mO[batch, 0, head_kv * G + row, col] = (o * inv).to(mO.element_type)
            if const_expr(mLSE is not None):
                if rank == 0 and col == 0:
                    lse = -Float32.inf
                    if l_all > 0.0:
                        lse = (m_all_use + cute.math.log2(l_all, fastmath=True)) * LN_2
                    mLSE[batch, head_kv * G + row, 0] = lse
        cute.arch.cluster_wait()  # no CTA leaves while another still reads its shared memory
