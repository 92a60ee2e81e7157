"""Upstream's SM120 forward as a kernel class (kernel "sm120"): upstream's code, every knob from the config.

Its shared-memory formula is upstream's `can_implement` one, as the compiled struct has it (head dims padded to
16, each tile aligned to 1024 B; the same bytes as upstream's formula wherever its tiles are whole KBs, as on every
suite's class); its rules are the ones upstream's SM80 code needs beyond that.

A learnable sink (gpt-oss: one logit per query head, a softmax column with no value) is folded into the finished
row: with the row's LSE l and the sink s, the LSE becomes l' = log(e^l + e^s) and the output O * e^(l - l'), the same
numbers as adding e^(s - max) to the denominator before normalizing (upstream's Softmax.finalize with sink_val; a row
that sees no key gets l' = s and O = 0). It costs an exp and a log per row and a multiply per output element, after the
mainloop, so the class's tuned configs serve sink calls as they are (a per-call feature, not a class dimension).
Upstream's SM80 kernel takes no sink argument: `__call__` hands the sink tensor to upstream's kernel as the last of
its aux tensors, `compute_one_n_block` takes it back off (so score_mod sees the caller's own), and `epilogue` folds it.
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

from fa4tune.feasibility import OK, Verdict
from fa4tune.kernel_class import ForwardKernel, Limits

BYTES_PER_ELEMENT = 2  # fp16 / bf16
TILE_ALIGN = 1024  # upstream's SharedStorage aligns every tile to 1024 B (cute.struct.Align[..., 1024])
HEAD_DIM_MULTIPLE = 16  # upstream pads head_dim (tile_hdim) to a multiple of 16


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value."""
    return -(-value // multiple) * multiple


def tile_bytes(rows: int, head_dim: int, stages: int = 1) -> int:
    """Bytes of a (rows, head_dim, stages) tile in upstream's shared storage."""
    return round_up(rows * round_up(head_dim, HEAD_DIM_MULTIPLE) * stages * BYTES_PER_ELEMENT, TILE_ALIGN)


def with_last_tensor(aux_data: AuxData, tensor) -> AuxData:
    """aux_data with `tensor` after its own tensors (plain Python: the DSL rewrites `or` in traced code)."""
    return AuxData([*(aux_data.tensors or ()), tensor], aux_data.scalars)


def without_last_tensor(aux_data: AuxData) -> tuple[AuxData, object]:
    """(aux_data without its last tensor, that tensor): with_last_tensor undone."""
    *own, last = aux_data.tensors
    return AuxData(own or None, aux_data.scalars), last


class TunedForwardSm120(ForwardKernel, FlashAttentionForwardSm120):
    """Upstream's SM120 forward (SM80 mma.sync, cp.async K/V pipeline), all knobs from the config."""

    name = "sm120"
    upstream = FlashAttentionForwardSm120
    varlen = True  # upstream's SM80 code reads cu_seqlens (SeqlenInfo, the varlen tile scheduler)
    # upstream's SM80 code: a sliding window (BlockInfo, AttentionMask's mask_local), the soft-cap (the host's score_mod)
    # and per-sequence lengths (SeqlenInfo's seqused_q / seqused_k), as upstream's SM120 path runs them; a learnable
    # sink folded into each finished row (fold_learnable_sink)
    features = frozenset({"local", "softcap", "seqused", "seqused_q", "learnable_sink"})
    limits = Limits(num_stages=(1, 2, 3, 4))
    # while a kernel traces: whether the sink rides in aux_data (upstream's kernel body), and the sink tensor itself
    sink_in_aux = False
    learnable_sink_traced = None

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """Q, K and V tiles (K and V per stage); with Q_in_regs V shares Q's buffer."""
        q = tile_bytes(config.tile_m, problem_class.head_dim)
        k = tile_bytes(config.tile_n, problem_class.head_dim, config.num_stages)
        v = tile_bytes(config.tile_n, problem_class.head_dim_v, config.num_stages)
        if config.Q_in_regs:
            return max(q, v) + k, f"max(Q {q}, V {v}) + K {k} (Q_in_regs shares Q and V)"
        return q + k + v, f"Q {q} + K {k} + V {v}"

    @classmethod
    def can_implement(cls, config, problem_class, target) -> Verdict:
        """Upstream's rows-per-warp rule, and the rules its SM80 code needs that upstream does not check."""
        if (config.tile_m * 2) % config.num_threads:
            # upstream's rule; it is the MMA layout's: num_threads/32 warps of 16 rows each must tile tile_m
            return Verdict(False, "tile_m_x2_divisible_by_num_threads",
                           f"tile_m*2 = {config.tile_m * 2} is not a multiple of num_threads={config.num_threads} "
                           f"({config.num_threads // 32} MMA warps of 16 rows need tile_m to be a multiple of {config.num_threads // 2})")
        if config.Q_in_regs and config.num_stages > 1:
            # Measured: Q_in_regs with 2 stages compiles but gives wrong outputs (max error 3.7 vs a tolerance
            # of 0.016, every problem class; docs/measurements/2026-11-29-h200-smoke.md). Upstream PR #2499 also
            # pairs Q_in_regs with one stage only.
            return Verdict(False, "Q_in_regs_one_stage",
                           f"Q_in_regs needs num_stages=1 (Q shares its buffer with V), got num_stages={config.num_stages}")
        gqa = problem_class.qhead_per_kvhead
        if gqa > 1 and config.tile_m & (config.tile_m - 1):
            # Found by compiling: PackGQA's layouts assert for tile_m=192 (qhead_per_kvhead 2 and 4).
            return Verdict(False, "pack_gqa_tile_m_power_of_two",
                           f"with GQA packing (qhead_per_kvhead={gqa}) tile_m must be a power of two, got {config.tile_m}")
        if gqa > 1 and config.tile_m > config.num_threads:
            # Measured on the H200 sweep (docs/measurements/2026-11-29-h200-fwd-sweep.md): with GQA packing every
            # tile_m=256 config with 128 threads failed PackGQA's assertion at compile time; all others compiled.
            return Verdict(False, "pack_gqa_tile_m_le_num_threads",
                           f"with GQA packing (qhead_per_kvhead={gqa}) tile_m ({config.tile_m}) must not exceed num_threads ({config.num_threads})")
        return OK

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
