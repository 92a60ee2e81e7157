"""Split-KV (kernel "sm120_splitkv", issue #13): upstream's SM120 forward with the KV sequence split across CTAs.

One query token over a long KV gives upstream's SM120 forward one CTA per (batch, KV head) with GQA packing, a handful
of CTAs for the whole GPU. Splitting the KV sequence across CTAs fills the machine; upstream's combine kernel
(flash_attn.cute.flash_fwd_combine, cp.async + fp32 math, nothing SM120 lacks) merges the fp32 partial outputs by
their LSEs. The decode entries of experiment.py run it (docs/measurements/2026-12-01-h200-splitkv.md: 3.0-22x
upstream's SM120 path, on par with SDPA). Graduated from experiment.py on 2026-12-05, unchanged.
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
from cutlass.cute.nvgpu import warp
from flash_attn.cute import ampere_helpers as sm80_utils
from flash_attn.cute import utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.block_sparsity import BlockSparseTensors
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.pack_gqa import PackGQA, pack_gqa_layout
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.tile_scheduler import SingleTileScheduler, TileSchedulerArguments
from flash_attn.cute.utils import AuxData
from quack import layout_utils

from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.feasibility import OK, Verdict
from fa4tune.kernel_class import Limits
from kernels.tuned_forward_sm120 import TunedForwardSm120

SPLITS_DOMAIN = (0, 1, 2, 4, 8, 16, 32, 64, 128)  # 0: split_kv_heuristic; upstream's combine takes up to 256
MIN_BLOCKS_PER_SPLIT = 2  # below this a split's prologue (Q load, pipeline fill) and its partial write dominate
ASSUMED_REGISTERS = 255  # registers per thread before compiling (the SM120 forwards compile at 226-255)
STATIC_SHAPES = {"decode": (1, 4096), "chunked": (512, 8192), "prefill": (8192, 8192)}  # (seqlen_q, seqlen_k) per regime


def ctas_per_sm(kernel: type, config: ForwardConfig, pc: ProblemClass, target) -> int:
    """CTAs of `config` one SM holds at once, by shared memory, threads and (assumed) registers."""
    smem = kernel.smem_bytes(config, pc)[0] + target.smem_reserved_per_block
    by_registers = target.registers_per_sm // (config.num_threads * ASSUMED_REGISTERS)
    return max(1, min(target.smem_per_sm // smem, target.max_threads_per_sm // config.num_threads,
                      target.max_blocks_per_sm, by_registers))


def split_kv_heuristic(total_mblocks: int, num_n_blocks: int, slots: int, max_splits: int = SPLITS_DOMAIN[-1]) -> int:
    """How many KV splits: enough CTAs to fill `slots` (SMs x CTAs per SM) once, never more than one wave, each
    split at least MIN_BLOCKS_PER_SPLIT KV blocks long (upstream's num_splits_heuristic with CTAs per SM and a
    minimum split length), then the fewest splits that keep that length, so that no split is empty."""
    if total_mblocks <= 0 or num_n_blocks < 2 * MIN_BLOCKS_PER_SPLIT:
        return 1
    splits = max(1, min(slots // total_mblocks, num_n_blocks // MIN_BLOCKS_PER_SPLIT, max_splits))
    # the fewest splits with the same blocks per split: splits of ceil(n / S) blocks leave the last ones empty when S
    # does not divide n (33 splits of 256 blocks: 32 of 8 blocks and an empty one), and an empty split still costs a
    # CTA, a partial and a combine wider than 32 (docs/measurements/2026-12-03-h200-decode-split-rounding.md)
    return -(-num_n_blocks // -(-num_n_blocks // splits))


class SplitKvForwardSm120(TunedForwardSm120):
    """Upstream's SM120 forward with the KV sequence split across CTAs (split-KV), GQA heads packed into M.

    The grid is (m blocks, heads x splits, batch) (upstream's SingleTileScheduler with is_split_kv); split s of
    an m block runs KV blocks [s*ceil(n/S), (s+1)*ceil(n/S)) of that block's range (upstream's BlockInfo, causal
    ranges included), walking them from the last down as upstream's mainloop does, and never loading a block
    below its range. Each split writes its fp32 partial O straight from the accumulator registers (no shared
    memory: the partial is 4 bytes wide and the write is small next to the split's K/V reads) and its LSE;
    a split with no KV block (ceil division, or causal ranges shorter than S splits) writes LSE = -inf, which the
    combine weighs 0. The host (fa4tune.sm120_interface) allocates the partials when num_splits_for(...) > 1 and
    runs upstream's combine after; the kernel knows it runs split when O has the partials' extra mode.
    """

    name = "sm120_splitkv"
    knobs = {"num_splits": SPLITS_DOMAIN}
    # seqused (seqused_k): a KV cache's per-sequence lengths bound each sequence's block range (upstream's SeqlenInfoQK);
    # paged: a paged KV cache (page_table; load_paged gathers it); local: a sliding window, whose blocks (upstream's
    # BlockInfo with is_local) the splits divide, every block masked as the causal ones are; softcap: upstream's
    # score_mod on S before the mask, as its SM80 loop applies it; no seqused_q (its partial rows are dense); a
    # learnable sink is folded into split 0's partial only (the combine's log-sum-exp then counts it once)
    features = frozenset({"seqused", "paged", "learnable_sink", "local", "softcap"})
    # head dims: 64-128 gated on the GPU (the gate matrix); 256 compiles for sm_120a without spills, combine included
    # (32x32 and 32x64 tiles with 64 threads: 233-253 registers; docs/measurements/2026-12-05-wide-head-dims.md), so
    # a d256 decode study may try it; its trials pass the gate like any
    limits = Limits(num_stages=(1, 2, 3, 4), head_dim=(64, 256))
    # where the search offers it: decode (3-22x upstream, its entries) and chunked prefills (1.18x upstream at sq 512
    # over 8K, unsplit: the 2026-12-01 split-KV record, section 4), not prefills, whose query tiles fill
    # the GPU unsplit (a 20-trial study of a prefill class drew it six times, all pruned: issue 68)
    regimes = frozenset({"decode", "chunked"})

    def __init__(self, *args, num_splits: int = 0, page_size: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_splits = num_splits  # the host's choice reaches the kernel as the partials' leading extent
        self.page_size = page_size  # a paged call's tokens per page (0: a contiguous cache); the host passes it
        self.V_ahead = not self.Q_in_regs  # the prologue sends the last stage's V too (see mainloop)
        assert self.mask_mod is None, "sm120_splitkv has no mask_mod (its score_mod: the soft-cap's)"

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """Upstream's tiles: the partial O leaves from registers, so splitting adds no shared memory."""
        return super().smem_bytes(config, problem_class)

    @classmethod
    def num_n_blocks(cls, config, problem) -> int:
        """KV blocks of the longest row range (non-causal or causal bottom-right: all of seqlen_k; a window's left
        side: the keys its first query tile reaches, plus the block its edge cuts)."""
        keys = problem.seqlen_k
        if problem.window_size_left >= 0:
            keys = min(keys, problem.window_size_left + min(problem.seqlen_q, config.tile_m) + config.tile_n)
        return -(-keys // config.tile_n)

    @classmethod
    def num_splits_for(cls, config, problem, num_sms: int) -> int:
        """The splits this config runs `problem` with: its num_splits knob, or (0) split_kv_heuristic."""
        chosen = config.extra_knobs.get("num_splits", 0)
        if chosen:
            return chosen
        from fa4tune.targets import get_target

        pc = problem.problem_class
        rows = problem.seqlen_q * pc.qhead_per_kvhead  # GQA heads packed into M
        total_mblocks = problem.batch * problem.num_heads_kv * -(-rows // config.tile_m)
        slots = num_sms * ctas_per_sm(cls, config, pc, get_target())
        return split_kv_heuristic(total_mblocks, cls.num_n_blocks(config, problem), slots)

    @classmethod
    def can_implement_problem(cls, config, problem, target) -> Verdict:
        """Per-problem rules: an explicit num_splits within the KV blocks; causal only bottom-right with sq <= sk."""
        splits, blocks = config.extra_knobs.get("num_splits", 0), cls.num_n_blocks(config, problem)
        if splits > blocks:
            return Verdict(False, "num_splits_le_kv_blocks",
                           f"num_splits={splits} is more than the {blocks} KV blocks of seqlen_k={problem.seqlen_k} "
                           f"with tile_n={config.tile_n}")
        if problem.causal and problem.seqlen_q > problem.seqlen_k:
            # bottom-right alignment leaves the first sq - sk query rows with no key at all
            return Verdict(False, "causal_seqlen_q_le_seqlen_k",
                           f"causal needs seqlen_q <= seqlen_k (bottom-right aligned), got seqlen_q={problem.seqlen_q} "
                           f"> seqlen_k={problem.seqlen_k}")
        return OK

    @classmethod
    def static_problem(cls, problem_class):
        """The static check's shape: the workload of the class's regime, so that its facts are those of the kernel
        the class's problems run. A decode (one query token over 4K keys) splits; a chunked prefill (512 over 8K,
        causal) splits where its query tiles leave CTA slots free (without GQA packing); a prefill (8K over 8K, 16 KV
        heads: more query tiles than any SM120 part's CTA slots) runs unsplit unless num_splits asks for splits."""
        from fa4tune.config import NO_WINDOW, Problem

        kv_heads = 16 if problem_class.regime == "prefill" else 8
        sq, sk = STATIC_SHAPES[problem_class.regime]
        return Problem(1, sq, sk, kv_heads * problem_class.qhead_per_kvhead, kv_heads, problem_class.head_dim,
                       problem_class.head_dim_v, problem_class.causal, problem_class.dtype, backward=False,
                       page_size=problem_class.page_size,
                       window_size_left=sk // 4 if problem_class.window else NO_WINDOW)  # a window class: is_local

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
        """Upstream's SM80 host code with split-KV: O (num_splits, b, s, h, d) fp32 and LSE (num_splits, b, h, s);
        mSeqUsedK (a KV cache's used lengths, one per sequence) bounds each sequence's KV blocks and so its splits.
        With mPageTable (batch, pages per sequence) K and V are page pools (num_pages, page_size, h_kv, d)."""
        assert (mPageTable is not None) == (self.page_size > 0), "sm120_splitkv: a page table needs its page_size"
        assert mCuSeqlensQ is None and mCuSeqlensK is None and mSeqUsedQ is None, \
            "sm120_splitkv: no packed batches, no seqused_q (seqused_k only)"
        self.is_split_kv = len(mO.shape) == 5
        if const_expr(self.is_split_kv):
            assert mO.element_type == Float32 and mLSE is not None, "split-KV partials are fp32 O with an LSE"
        o_type = mQ.element_type if const_expr(self.is_split_kv) else mO.element_type
        self._check_type(mQ.element_type, mK.element_type, mV.element_type, o_type,
                         mLSE.element_type if const_expr(mLSE is not None) else None, None, None, None, None)
        tiled_mma_qk, tiled_mma_pv = self._get_tiled_mma()
        self.num_mma_threads = tiled_mma_pv.size
        self.num_producer_threads = self.num_threads
        self.num_Q_load_threads = self.num_threads
        self.num_epilogue_threads = self.num_threads
        self.use_tma_O = False
        self._setup_attributes()
        SharedStorage = self._get_shared_storage_cls()
        mQ, mK, mV, mO = [assume_tensor_aligned(t) for t in (mQ, mK, mV, mO)]
        to_kernel = lambda t, order: cute.make_tensor(t.iterator, cute.select(t.layout, mode=order))
        num_splits = mO.shape[0] if const_expr(self.is_split_kv) else Int32(1)
        # (b, s, h, d) -> (s, d, h, b) (page pools: (page_size, d, h, page)); the partials' split mode goes last
        mQ = to_kernel(mQ, [1, 3, 2, 0])
        mK, mV = to_kernel(mK, [1, 3, 2, 0]), to_kernel(mV, [1, 3, 2, 0])
        mO = to_kernel(mO, [2, 4, 3, 1, 0] if const_expr(self.is_split_kv) else [1, 3, 2, 0])
        if const_expr(mLSE is not None):
            mLSE = to_kernel(mLSE, [3, 2, 1, 0] if const_expr(self.is_split_kv) else [2, 1, 0])
        if const_expr(self.pack_gqa):
            nheads_kv = mK.shape[2]
            mQ = pack_gqa_layout(mQ, self.qhead_per_kvhead, nheads_kv, head_idx=2)
            mO = pack_gqa_layout(mO, self.qhead_per_kvhead, nheads_kv, head_idx=2)
            if const_expr(mLSE is not None):
                mLSE = pack_gqa_layout(mLSE, self.qhead_per_kvhead, nheads_kv, head_idx=1)
        tile_sched_args = TileSchedulerArguments(
            num_block=cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m),
            num_head=cute.size(mQ.shape[2]),
            num_batch=cute.size(mQ.shape[3]),
            num_splits=num_splits,
            seqlen_k=0,
            headdim=mQ.shape[1],
            headdim_v=mV.shape[1],
            total_q=cute.size(mQ.shape[0]) * cute.size(mQ.shape[3]),
            tile_shape_mn=(self.tile_m, self.tile_n),
            qhead_per_kvhead_packgqa=self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1,
            is_split_kv=self.is_split_kv,
        )
        tile_sched_params = SingleTileScheduler.to_underlying_arguments(tile_sched_args)
        grid_dim = SingleTileScheduler.get_grid_shape(tile_sched_params)
        softmax_scale_log2, softmax_scale = utils.compute_softmax_scale_log2(softmax_scale, self.score_mod)
        if const_expr(window_size_left is not None):
            window_size_left = Int32(window_size_left)
        if const_expr(window_size_right is not None):
            window_size_right = Int32(window_size_right)
        self.kernel(
            mQ, mK, mV, mO, mLSE, mSeqUsedK, mPageTable, softmax_scale_log2, softmax_scale, num_splits,
            window_size_left, window_size_right,
            self.sQ_layout, self.sK_layout, self.sV_layout, self.sO_layout,
            self.gmem_tiled_copy_Q, self.gmem_tiled_copy_K, self.gmem_tiled_copy_V, self.gmem_tiled_copy_O,
            tiled_mma_qk, tiled_mma_pv, SharedStorage, tile_sched_params, learnable_sink,
        ).launch(grid=grid_dim, block=[self.num_threads, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: Optional[cute.Tensor],
        mSeqUsedK: Optional[cute.Tensor],
        mPageTable: Optional[cute.Tensor],
        softmax_scale_log2: Float32,
        softmax_scale: Optional[Float32],
        num_splits: Int32,
        window_size_left: Optional[Int32],
        window_size_right: Optional[Int32],
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        gmem_tiled_copy_Q: cute.TiledCopy,
        gmem_tiled_copy_K: cute.TiledCopy,
        gmem_tiled_copy_V: cute.TiledCopy,
        gmem_tiled_copy_O: cute.TiledCopy,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        tile_sched_params,
        learnable_sink: Optional[cute.Tensor] = None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        if const_expr(self.is_split_kv):
            # the combine (a programmatic dependent launch) may be scheduled now; it waits for this grid's partials
            cute.arch.griddepcontrol_launch_dependents()
        tile_scheduler = SingleTileScheduler.create(tile_sched_params)
        work_tile = tile_scheduler.initial_work_tile_info()
        m_block, head_idx, batch_idx, split_idx = work_tile.tile_idx
        # keys per sequence: a page-table row's pages, or the cache's rows
        seqlen_k_static = mK.shape[0] if const_expr(mPageTable is None) else self.page_size * mPageTable.shape[1]
        m_block, head_idx, batch_idx = self.order_tile(m_block, head_idx, batch_idx, seqlen_k_static)
        qhead_packed = self.qhead_per_kvhead if const_expr(self.pack_gqa) else 1
        block_info = BlockInfo(self.tile_m, self.tile_n, self.is_causal, self.is_local, self.is_split_kv,
                               window_size_left, window_size_right, qhead_per_kvhead_packgqa=qhead_packed,
                               num_splits=num_splits)
        seqlen = SeqlenInfoQK.create(
            batch_idx=batch_idx,
            seqlen_q_static=mQ.shape[0] if const_expr(not self.pack_gqa) else mQ.shape[0][1],
            seqlen_k_static=seqlen_k_static,
            mSeqUsedK=mSeqUsedK,  # this sequence's used keys: its split ranges divide them, its masks stop at them
        )
        n_block_min, n_block_max = block_info.get_n_block_min_max(seqlen, m_block, split_idx, num_splits)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((self.tile_m, self.tile_hdimv)), Float32)
        acc_O.fill(0.0)
        softmax = Softmax.create(softmax_scale_log2, num_rows=acc_O.shape[0][0] * acc_O.shape[1], softmax_scale=softmax_scale)
        softmax.reset()
        if n_block_min < n_block_max:
            self.mainloop(mQ, mK, mV, storage, sQ, sK_layout, sV_layout, gmem_tiled_copy_Q, gmem_tiled_copy_K,
                          gmem_tiled_copy_V, tiled_mma_qk, tiled_mma_pv, acc_O, softmax, seqlen, block_info,
                          m_block, head_idx, batch_idx, n_block_min, n_block_max, tidx, mPageTable)
            softmax.rescale_O(acc_O, softmax.finalize())
        else:
            # an empty split (or an empty KV): O stays 0 and the LSE -inf, so the combine gives it no weight
            softmax.row_sum.fill(-Float32.inf)
        if const_expr(learnable_sink is not None):
            if split_idx == 0:  # once per row: the combine weighs split 0's folded partial by its LSE, the sink with it
                self.fold_learnable_sink(acc_O, softmax.row_sum, learnable_sink, tiled_mma_pv, tidx, m_block, head_idx)
        if const_expr(self.is_split_kv):
            self.epilogue_partial(acc_O, softmax.row_sum, mO[None, None, None, None, split_idx],
                                  mLSE[None, None, None, split_idx], seqlen, tiled_mma_pv, tidx, m_block, head_idx, batch_idx)
        else:
            sO = cute.make_tensor(sQ.iterator, sO_layout)
            self.epilogue(acc_O, softmax.row_sum, mO, mLSE, sO, seqlen, gmem_tiled_copy_O, None, tiled_mma_pv,
                          tidx, m_block, head_idx, batch_idx)

    def order_tile(self, m_block: Int32, head: Int32, batch: Int32, seqlen_k: Int32):
        """The tile a CTA runs, from its block index's (the grid's head mode holds head x split) and the keys per head:
        the same here."""
        return m_block, head, batch

    @cute.jit
    def mainloop(self, mQ, mK, mV, storage, sQ, sK_layout, sV_layout, gmem_tiled_copy_Q, gmem_tiled_copy_K,
                 gmem_tiled_copy_V, tiled_mma_qk, tiled_mma_pv, acc_O, softmax, seqlen, block_info,
                 m_block, head_idx, batch_idx, n_block_min, n_block_max, tidx, mPageTable=None):
        """Upstream's SM80 mainloop over KV blocks [n_block_min, n_block_max), last block first; K and V from a
        contiguous cache, or gathered from their pages (load_paged)."""
        num_head_kv = head_idx if const_expr(self.pack_gqa) else head_idx // self.qhead_per_kvhead
        mQ_cur = mQ[None, None, head_idx, batch_idx]
        paged = const_expr(mPageTable is not None)
        # a page pool's (page_size, d, page) of this KV head, or this sequence's (s, d) tiled into KV blocks
        mK_cur = mK[None, None, num_head_kv, None] if paged else mK[None, None, num_head_kv, batch_idx]
        mV_cur = mV[None, None, num_head_kv, None] if paged else mV[None, None, num_head_kv, batch_idx]
        if const_expr(not paged):
            gK = cute.local_tile(mK_cur, (self.tile_n, self.tile_hdim), (None, 0))
            gV = cute.local_tile(mV_cur, (self.tile_n, self.tile_hdimv), (None, 0))
        else:  # the first tile of page 0: only its partition's layout is used (load_paged moves it to each row's page)
            gK = cute.local_tile(mK_cur[None, None, 0], (self.tile_n, self.tile_hdim), (0, 0))
            gV = cute.local_tile(mV_cur[None, None, 0], (self.tile_n, self.tile_hdimv), (0, 0))
        sK = storage.sK.get_tensor(sK_layout)
        if const_expr(not self.Q_in_regs):
            sV = storage.sV.get_tensor(sV_layout)
        else:
            sV = cute.make_tensor(cute.recast_ptr(sQ.iterator, dtype=self.dtype), sV_layout)
        sVt = layout_utils.transpose_view(sV)
        gmem_thr_copy_K = gmem_tiled_copy_K.get_slice(tidx)
        gmem_thr_copy_V = gmem_tiled_copy_V.get_slice(tidx)
        tKsK, tKgK = gmem_thr_copy_K.partition_D(sK), gmem_thr_copy_K.partition_S(gK)
        tVsV, tVgV = gmem_thr_copy_V.partition_D(sV), gmem_thr_copy_V.partition_S(gV)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
        tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sVt[None, None, 0]))
        copy_QK = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        copy_V = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        smem_thr_copy_Q = utils.make_tiled_copy_A(copy_QK, tiled_mma_qk).get_slice(tidx)
        smem_thr_copy_K = utils.make_tiled_copy_B(copy_QK, tiled_mma_qk).get_slice(tidx)
        smem_thr_copy_V = utils.make_tiled_copy_B(copy_V, tiled_mma_pv).get_slice(tidx)
        tSsQ = smem_thr_copy_Q.partition_S(sQ)
        tSsK = smem_thr_copy_K.partition_S(sK)
        tOsVt = smem_thr_copy_V.partition_S(sVt)
        cK = cute.make_identity_tensor((self.tile_n, self.tile_hdim))
        tKcK = gmem_thr_copy_K.partition_S(cK)
        t0KcK = gmem_thr_copy_K.get_slice(0).partition_S(cK)
        if const_expr(self.tile_hdim == self.tile_hdimv):
            tVcV, t0VcV = tKcK, t0KcK
        else:
            cV = cute.make_identity_tensor((self.tile_n, self.tile_hdimv))
            tVcV = gmem_thr_copy_V.partition_S(cV)
            t0VcV = gmem_thr_copy_V.get_slice(0).partition_S(cV)
        tKpK = utils.predicate_k(tKcK, limit=mK.shape[1])
        tVpV = tKpK if const_expr(self.same_hdim_kv) else utils.predicate_k(tVcV, limit=mV.shape[1])
        if const_expr(not paged):
            load_K = partial(self.load_K, gmem_tiled_copy_K, tKgK, tKsK, tKcK, t0KcK, tKpK, seqlen=seqlen.seqlen_k)
            load_V = partial(self.load_V, gmem_tiled_copy_V, tVgV, tVsV, tVcV, t0VcV, tVpV, seqlen=seqlen.seqlen_k)
        else:
            page_row = mPageTable[batch_idx, None]
            load_K = partial(self.load_paged, gmem_tiled_copy_K, gmem_thr_copy_K, mK_cur, page_row, tKgK, tKsK, tKcK,
                             t0KcK, tKpK, self.tile_hdim, self.check_hdim_oob, seqlen=seqlen.seqlen_k)
            load_V = partial(self.load_paged, gmem_tiled_copy_V, gmem_thr_copy_V, mV_cur, page_row, tVgV, tVsV, tVcV,
                             t0VcV, tVpV, self.tile_hdimv, self.check_hdim_v_oob, seqlen=seqlen.seqlen_k)
        step = partial(
            self.compute_block,
            mma=SimpleNamespace(thr_mma_qk=thr_mma_qk, thr_mma_pv=thr_mma_pv, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, acc_O=acc_O),
            smem_copy=SimpleNamespace(smem_thr_copy_Q=smem_thr_copy_Q, smem_thr_copy_K=smem_thr_copy_K,
                                      smem_thr_copy_V=smem_thr_copy_V, tSsQ=tSsQ, tSsK=tSsK, tOsVt=tOsVt),
            softmax=softmax, load_K=load_K, load_V=load_V, n_block_min=n_block_min,
            score_fn=partial(self.apply_score_mod, thr_mma_qk, batch_idx, head_idx, m_block, softmax_scale=softmax.softmax_scale,
                             seqlen=seqlen) if const_expr(self.score_mod is not None) else None,
        )

        # Prologue: Q, then K and V of the first num_stages blocks, none below the split. Upstream leaves the last
        # stage's V to the first block's step (after K of that block has landed), so a split of num_stages blocks
        # waits for two round trips to memory; here that V goes out with the prologue too (V_ahead), except with
        # Q_in_regs, where that V buffer holds Q until Q is in registers. The cp.async groups keep upstream's order.
        n_block = n_block_max - 1
        if const_expr(not self.pack_gqa):
            gQ = cute.local_tile(mQ_cur, (self.tile_m, self.tile_hdim), (m_block, 0))
            self.load_Q(gmem_tiled_copy_Q.get_slice(tidx), gQ, sQ, m_block, seqlen=seqlen.seqlen_q, headdim=mQ.shape[1])
        else:
            pack_gqa = PackGQA(self.tile_m, self.tile_hdim, self.check_hdim_oob, self.qhead_per_kvhead)
            pack_gqa.load_Q(mQ_cur, sQ, gmem_tiled_copy_Q, tidx, m_block, seqlen.seqlen_q)
        cute.arch.cp_async_commit_group()

        def preprocess_Q():
            # Q's group landed: later groups are K and V of the stages (V_ahead: one more, the last stage's V)
            cute.arch.cp_async_wait_group(self.num_stages * 2 - 1 + (1 if const_expr(self.V_ahead) else 0))
            if const_expr(self.Q_in_regs):
                cute.arch.barrier()
                cute.copy(smem_thr_copy_Q, tSsQ, smem_thr_copy_Q.retile(tSrQ))

        if const_expr(self.Q_in_regs):
            load_K(n_block, smem_pipe_write=0, need_predicates=True)
            cute.arch.cp_async_commit_group()
            preprocess_Q()
            cute.arch.barrier()  # every thread has read Q before V overwrites its buffer
        for stage in cutlass.range_constexpr(self.num_stages):
            if const_expr(not self.Q_in_regs or stage > 0):
                if stage == 0 or n_block - stage >= n_block_min:
                    load_K(n_block - stage, smem_pipe_write=stage, need_predicates=stage == 0)
                cute.arch.cp_async_commit_group()
            if const_expr(stage < self.num_stages - 1 or self.V_ahead):
                if stage == 0 or n_block - stage >= n_block_min:
                    load_V(n_block - stage, smem_pipe_write=stage, need_predicates=stage == 0)
                cute.arch.cp_async_commit_group()
        if const_expr(not self.Q_in_regs):
            preprocess_Q()

        # a window masks every block as the causal mask does (upstream's SM80 loop masks each block causally); its
        # splits divide the window's blocks alone (block_info), so no block wholly outside it is read
        mask = AttentionMask(self.tile_m, self.tile_n, seqlen, block_info.window_size_left,
                             block_info.window_size_right, qhead_packed_of(self))
        mask_fn = partial(mask.apply_mask, batch_idx=batch_idx, head_idx=head_idx, m_block=m_block, thr_mma=thr_mma_qk,
                          mask_causal=self.is_causal, mask_local=self.is_local, mask_mod=None)
        # the split's last block first, masked for seqlen_k (and causal); then the causal diagonal's blocks;
        # then the unmasked rest down to the split's first block
        read, write = Int32(0), Int32(self.num_stages - 1)
        step(n_block, read, write, is_first_n_block=True, mask_fn=partial(mask_fn, mask_seqlen=True))
        read, write = self.advance_pipeline(read), self.advance_pipeline(write)
        if const_expr(self.is_causal):
            n_block_causal = block_info.get_n_block_min_causal_local_mask(seqlen, m_block, n_block_min)
            for n_tile in cutlass.range(n_block_max - 1 - n_block_causal, unroll=1):
                n_block = n_block_max - 2 - n_tile
                step(n_block, read, write, mask_fn=partial(mask_fn, mask_seqlen=True))
                read, write = self.advance_pipeline(read), self.advance_pipeline(write)
        for n_tile in cutlass.range(n_block - n_block_min, unroll=1):
            step(n_block - n_tile - 1, read, write, mask_fn=partial(mask_fn, mask_seqlen=False))
            read, write = self.advance_pipeline(read), self.advance_pipeline(write)

    @cute.jit
    def compute_block(self, n_block: Int32, smem_pipe_read: Int32, smem_pipe_write: Int32, mma: SimpleNamespace,
                      smem_copy: SimpleNamespace, softmax: Softmax, load_K: Callable, load_V: Callable,
                      n_block_min: Int32, mask_fn: Callable, score_fn: Optional[Callable] = None,
                      is_first_n_block: cutlass.Constexpr = False):
        """One KV block: S = Q K^T, the score_mod (score_fn: a soft-cap), mask, online softmax, O += P V; upstream's
        compute_one_n_block, except that the next K/V loads stop at the split's first block (n_block_min), not at 0."""
        stage_of = lambda index: index if const_expr(self.num_stages > 1) else 0

        def sync(pending: cutlass.Constexpr = self.num_stages * 2 - 2):
            cute.arch.cp_async_wait_group(pending)
            cute.arch.barrier()

        acc_S = cute.make_rmem_tensor(mma.thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S.fill(0.0)
        if const_expr(is_first_n_block and self.V_ahead):
            # the prologue sent this step's V load (its own group, the last): K of this block has landed when
            # one group more than upstream's count is still in flight; the group order after this step is upstream's
            sync(self.num_stages * 2 - 1)
        else:
            sync()  # K of this block has landed
            if self.num_stages == 1 or n_block - self.num_stages + 1 >= n_block_min:
                load_V(n_block - self.num_stages + 1, smem_pipe_write, need_predicates=is_first_n_block and self.num_stages == 1)
            cute.arch.cp_async_commit_group()
        sm80_utils.gemm(mma.thr_mma_qk, acc_S, mma.tSrQ, mma.tSrK, smem_copy.tSsQ, smem_copy.tSsK[None, None, None, stage_of(smem_pipe_read)],
                        smem_copy.smem_thr_copy_Q, smem_copy.smem_thr_copy_K, A_in_regs=self.Q_in_regs)
        if const_expr(score_fn is not None):
            score_fn(acc_S, n_block)
        smem_pipe_write = self.advance_pipeline(smem_pipe_write)

        def load_K_next():
            if n_block - self.num_stages >= n_block_min:
                load_K(n_block - self.num_stages, smem_pipe_write, need_predicates=False)
            cute.arch.cp_async_commit_group()

        if const_expr(self.num_stages == 1):
            sync()  # V of this block has landed
            load_K_next()
        mask_fn(acc_S, n_block=n_block)
        row_scale = softmax.online_softmax(acc_S, is_first=is_first_n_block, check_inf=True)
        softmax.rescale_O(mma.acc_O, row_scale)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        if const_expr(self.num_stages > 1):
            sync()
            load_K_next()
        sm80_utils.gemm_rs(mma.thr_mma_pv, mma.acc_O, layout_utils.reshape_acc_to_frgA(rP), mma.tOrVt,
                           smem_copy.tOsVt[None, None, None, stage_of(smem_pipe_read)], smem_copy.smem_thr_copy_V)

    @cute.jit
    def load_paged(self, gmem_tiled_copy: cute.TiledCopy, gmem_thr_copy: cute.TiledCopy, mX: cute.Tensor,
                   page_row: cute.Tensor, tXgX: cute.Tensor, tXsX: cute.Tensor, tXcX: cute.Tensor, t0XcX: cute.Tensor,
                   tXpX: cute.Tensor, tile_hdim: cutlass.Constexpr, check_hdim_oob: cutlass.Constexpr, block: Int32,
                   smem_pipe_write: Int32, seqlen: Int32, need_predicates: cutlass.Constexpr):
        """KV block `block` of a sequence from a page pool mX (page_size, d, page) into shared memory, as upstream's
        load_K / load_V load a contiguous one (cp.async, the same partition; under need_predicates, rows at or past
        seqlen zero-filled). Pages of a multiple of tile_n tokens hold whole blocks: one page-table entry gives the
        block's page, the block's offset in it follows. Smaller pages: each row the thread copies lies in the page of its
        token; where tile_n is a multiple of the page and the rows a thread copies at once (the copy's rows per pass)
        divide it, the page of each of the thread's rows is known at trace time, so each page's entry is read once.
        A page-table entry is only read for a token below seqlen (indices clamped to the sequence's last page), so
        entries past a sequence's pages may hold anything (vLLM leaves them stale)."""
        stage = smem_pipe_write if const_expr(self.num_stages > 1) else 0
        rows_per_pass = gmem_tiled_copy.tiler_mn[0].shape
        whole_passes = const_expr(self.tile_n % rows_per_pass == 0)
        # rows (thread 0's offsets, t0XcX) this thread copies: within the block (a partial last pass has rows past
        # it: skipped, as upstream skips them) and, under need_predicates, below seqlen (zero-filled past it, as
        # upstream's load_V does: P is 0 there, and 0 * a stale NaN would not be)
        in_block = self.tile_n - tXcX[0][0]
        in_sequence = seqlen - block * self.tile_n - tXcX[0][0]
        copy_row = partial(self._copy_row, gmem_tiled_copy, tXpX, check_hdim_oob, need_predicates, whole_passes)
        if const_expr(self.page_size % self.tile_n == 0):
            per_page = self.page_size // self.tile_n
            page = page_row[block // per_page]
            gX = cute.local_tile(mX[None, None, page], (self.tile_n, tile_hdim), (block % per_page, 0))
            tXgX_block = gmem_thr_copy.partition_S(gX)
            for n in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
                row = t0XcX[0, n, 0][0]
                copy_row(n, tXgX_block[None, n, None], tXsX[None, n, None, stage], row < in_block, row < in_sequence)
        else:
            last_page = (seqlen - 1) // self.page_size  # the sequence's last page: no entry past it is read
            known = const_expr(self.tile_n % self.page_size == 0 and self.page_size % rows_per_pass == 0)
            pages = {}  # (known) the page of each of the block's page slots, read once
            first_row = tXcX[0][0]  # this thread's first row; its others follow at thread 0's offsets (t0XcX)
            for n in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
                offset_n = t0XcX[0, n, 0][0]
                if const_expr(known):
                    slot = offset_n // self.page_size
                    if const_expr(slot not in pages):
                        pages[slot] = page_row[cutlass.min(block * (self.tile_n // self.page_size) + slot, last_page)]
                    page = pages[slot]
                    in_page = first_row + offset_n % self.page_size
                else:
                    token = block * self.tile_n + first_row + offset_n
                    page = page_row[cutlass.min(token // self.page_size, last_page)]
                    in_page = token % self.page_size
                # the row's source: this row of the pool, with the layout of the partition's row (its columns)
                row = tXgX[None, n, None]
                address = utils.elem_pointer(mX, (in_page, tXcX[0][1], page)).toint()
                source = cute.make_tensor(cute.make_ptr(mX.element_type, address, cute.AddressSpace.gmem, assumed_align=16),
                                          row.layout)
                copy_row(n, source, tXsX[None, n, None, stage], offset_n < in_block, offset_n < in_sequence)

    @cute.jit
    def _copy_row(self, gmem_tiled_copy: cute.TiledCopy, tXpX: cute.Tensor, check_hdim_oob: cutlass.Constexpr,
                  need_predicates: cutlass.Constexpr, whole_passes: cutlass.Constexpr, n: cutlass.Constexpr,
                  source: cute.Tensor, destination: cute.Tensor, in_block, in_sequence):
        """Row n of a thread's share of a KV block: copied with its head-dim predicate (a padded head dim); under
        need_predicates zero-filled where the row is not `in_sequence`; skipped where it is not `in_block` (a partial
        last pass)."""
        if const_expr(not need_predicates):
            predicate = tXpX[None, n, None] if const_expr(check_hdim_oob) else None
        else:
            predicate = cute.make_fragment_like(tXpX[None, 0, None])
            for k in cutlass.range_constexpr(cute.size(predicate.shape[1])):
                for i in cutlass.range_constexpr(cute.size(predicate.shape[0])):
                    predicate[i, k] = (tXpX[i, n, k] if const_expr(check_hdim_oob) else True) and in_sequence
        if const_expr(whole_passes):
            cute.copy(gmem_tiled_copy, source, destination, pred=predicate)
        else:
            if in_block:
                cute.copy(gmem_tiled_copy, source, destination, pred=predicate)

    @cute.jit
    def epilogue_partial(self, acc_O: cute.Tensor, lse: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                         seqlen: SeqlenInfoQK, tiled_mma: cute.TiledMma, tidx: Int32, m_block: Int32,
                         head_idx: Int32, batch_idx: Int32):
        """One split's fp32 O rows and LSE, from the accumulator registers straight to the partial buffers."""
        thr_mma = tiled_mma.get_slice(tidx)
        cO = cute.make_identity_tensor((self.tile_m, self.tile_hdimv))
        tOcO = layout_utils.reshape_acc_to_mn(thr_mma.partition_C(cO))
        rO = layout_utils.reshape_acc_to_mn(acc_O)
        mLSE_cur = mLSE[None, head_idx, batch_idx]
        mO_cur = mO[None, None, head_idx, batch_idx]
        rows = seqlen.seqlen_q * qhead_packed_of(self)
        head_dim_v = mO.shape[1]
        for r in cutlass.range_constexpr(cute.size(rO, mode=[0])):
            row = m_block * self.tile_m + tOcO[r, 0][0]
            if row < rows:
                if const_expr(self.pack_gqa):
                    m_idx = row // self.qhead_per_kvhead
                    coord = (row - m_idx * self.qhead_per_kvhead, m_idx)  # (query head in the group, position)
                else:
                    coord = row
                if tOcO[0, 0][1] == 0:  # one thread of the row's quad writes its LSE
                    lse_row = cute.make_tensor(utils.elem_pointer(mLSE_cur, (coord,)), cute.make_layout((1,)))
                    lse_row[0] = lse[r]
                o_row = cute.make_tensor(utils.elem_pointer(mO_cur, (coord, 0)), cute.make_layout((self.tile_hdimv,)))
                for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
                    col = tOcO[r, c][1]
                    if const_expr(not self.check_hdim_v_oob) or col < head_dim_v:
                        o_row[col] = rO[r, c]


def qhead_packed_of(kernel) -> int:
    """Query heads packed into one M row block (1 without GQA packing)."""
    return kernel.qhead_per_kvhead if kernel.pack_gqa else 1
