"""Upstream's SM120 backward with packed (varlen) GQA gradients written where upstream's postprocess reads them.

With GQA (several query heads per K/V head) the backward adds each block's dK and dV into fp32 accumulators, and a
postprocess kernel converts them. For a packed batch both address sequence b's rows at a padded offset, but they
disagree on which: the SM80 epilogue (flash_bwd.py, `padded_offset_k = seqlen.offset_k + batch_idx *
n_block_size`) does not round down to a whole tile, while the postprocess reads at SeqlenInfoQK's
`(offset + batch_idx * tile) // tile * tile`. Wherever a sequence starts off a tile boundary (a packed batch with
an earlier length that is not a multiple of n_block_size), its dK and dV come back wrong, for upstream's configs
as for ours (docs/measurements/2026-12-05-h100-varlen-gqa-backward.md). This class hands the epilogue an offset
that lands its adds on the postprocess's rows; unpacked calls and calls without GQA compile as upstream's.

`deterministic` (a call knob: flash_attn_func(deterministic=True) sets it) adds dQ in a fixed order. Each CTA owns one
key block n and walks the query blocks; upstream adds its dQ contribution to the fp32 accumulator with atomics, in
whatever order the CTAs arrive, so dQ's rounding differs run to run. Here each (batch, head, query block) has a counter
(upstream's dQ_semaphore, zeroed by the host): after its dQ gemm the CTA of key block n waits (thread 0 spins with an
acquire load, then a CTA barrier) until the counter reads n, adds, and after a CTA barrier thread 0 releases it + 1.
The key blocks that reach a query block are always 0..k (the causal range only shortens from below as n grows), so the
adds land in key-block order. With GQA the dK/dV adds of a KV head's query heads are ordered the same way (head in the
group), on upstream's dK_semaphore. The wait only ever points to a CTA with a lower block index (an earlier key block
of the same head, an earlier head of the same key block), which the GPU dispatches first, so it cannot deadlock.
A sliding window lets a query block's key blocks start past 0: refused (rule deterministic_local) until counted.
The learnable sink needs nothing here: the forward's LSE holds it, and the host's dQ postprocess reduces d(sink).
"""

import dataclasses

import cutlass
import cutlass.cute as cute
from flash_attn.cute import barrier, flash_bwd, utils
from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120
from flash_attn.cute.utils import AuxData

from fa4tune.feasibility import BYTES_PER_ELEMENT, OK, Verdict, padded_head_dim
from fa4tune.kernel_class import BackwardKernel, Limits
from kernels.learnable_sink_sm120 import with_last_tensor, without_last_tensor


@cute.jit
def acquire_turn(lock: cute.Pointer, turn: cutlass.Int32):
    """Thread 0 waits until the counter at `lock` reads `turn` (an acquire load), then the whole CTA goes on."""
    barrier.wait_eq(lock, cute.arch.thread_idx()[0], 0, turn)
    cute.arch.barrier()


@cute.jit
def release_turn(lock: cute.Pointer):
    """Once every thread of the CTA is past its adds, thread 0 adds 1 to the counter at `lock` (a release)."""
    cute.arch.barrier()
    barrier.arrive_inc(lock, cute.arch.thread_idx()[0], 0, 1)


class _OrderedDQ:
    """flash_bwd's `sm80_utils` while one query block traces under `deterministic`: the CTA takes its turn on the
    block's dQ counter right after the dQ gemm (the gemm whose B fragment is `tdQrK`), before its atomic adds, and
    releases it before the next gemm (or, via `pending`, when the block's body ends)."""

    def __init__(self, helpers, tdQrK, lock, turn):
        self.helpers, self._tdQrK, self._lock, self._turn = helpers, tdQrK, lock, turn
        self.pending = False

    def __getattr__(self, name):
        return getattr(self.helpers, name)

    def gemm(self, tiled_mma, acc, tCrA, tCrB, *args, **kwargs):
        if self.pending:
            self.release()
        self.helpers.gemm(tiled_mma, acc, tCrA, tCrB, *args, **kwargs)
        if tCrB is self._tdQrK:
            acquire_turn(self._lock, self._turn)
            self.pending = True

    def release(self):
        release_turn(self._lock)
        self.pending = False


class BackwardSm120(BackwardKernel, FlashAttentionBackwardSm120):
    """Upstream's SM120 backward (SM80 mma.sync), every knob from the config, packed GQA gradients fixed: the
    backward kernel class "sm120", upstream's baseline, and the base of every other backward class."""

    name = "sm120"
    limits = Limits(num_stages=(1, 2), head_dim=(8, 256))
    # export writes knobs into upstream's interface; this class differs from upstream's only by the packed GQA fix,
    # a patch of its own (docs/measurements/data/2026-12-05-upstream-fix-0001-varlen-gqa-dkv-offset.patch)
    upstream = FlashAttentionBackwardSm120
    # upstream's SM80 backward: a sliding window, the soft-cap's backward score_mod, per-sequence lengths
    features = frozenset({"local", "softcap", "seqused", "seqused_q"})
    call_knobs = {"deterministic": (False, True)}  # dQ (and GQA dK/dV) added in a fixed order: the module's docstring

    def __init__(self, *args, deterministic: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.deterministic = deterministic
        self.semaphores_traced = (None, None)  # while the kernel traces: the dQ and dK/dV counters (__call__)
        self.ordered_dkv = False

    @classmethod
    def can_implement(cls, config, problem_class, target):
        """A deterministic backward counts each query block's key blocks from 0: no sliding window yet."""
        if config.extra_knobs.get("deterministic") and problem_class.window:
            return Verdict(False, "deterministic_local", f"the deterministic backward orders dQ by key block from the "
                           f"first, and a sliding window's query blocks start past it ({problem_class.name}): "
                           "deterministic=True runs without a window only")
        return OK

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """The shared storage as it compiles (flash_bwd.py _get_shared_storage_cls), and a breakdown.

        Upstream's can_implement counts only Q, dO, K and V, and lets V_in_regs share Q's and V's space. The struct
        also holds LSE and dPsum (fp32) and the P and dS tiles, each tile 1024-byte aligned, the whole rounded up to
        1024; with V_in_regs its Q field grows to max(Q, V) and sV stays, so nothing is saved. Checked against every
        compiled backward of the H200 sweep (1,326 configs, docs/measurements/2026-12-01-h200-bwd-sweep.md).
        """
        hd, hdv = padded_head_dim(problem_class.head_dim), padded_head_dim(problem_class.head_dim_v)
        m, n = config.m_block_size, config.n_block_size
        k, v = n * hd * BYTES_PER_ELEMENT, n * hdv * BYTES_PER_ELEMENT
        q = m * hd * config.num_stages_Q * BYTES_PER_ELEMENT
        do = m * hdv * config.num_stages_dO * BYTES_PER_ELEMENT
        if config.V_in_regs:
            q = max(q, v)
        lse = (-(-m // 64) * 64 * (config.num_stages_Q - 1) + m) * 4
        p = m * n * BYTES_PER_ELEMENT
        offset = 0
        for size, align in ((k, 1024), (v, 1024), (q, 1024), (do, 1024), (lse, 128), (lse, 128), (p, 128), (p, 128)):
            offset = -(-offset // align) * align + size
        total = -(-offset // 1024) * 1024
        what = "max(Q, V)" if config.V_in_regs else "Q"
        return total, f"K {k} + V {v} + {what} {q} + dO {do} + LSE and dPsum {2 * lse} + P and dS {2 * p}, aligned"

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mdPsum: cute.Tensor, mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                 softmax_scale: cutlass.Float32, mCuSeqlensQ=None, mCuSeqlensK=None, mSeqUsedQ=None, mSeqUsedK=None,
                 window_size_left=None, window_size_right=None, mdQ_semaphore=None, mdK_semaphore=None,
                 mdV_semaphore=None, aux_data: AuxData = AuxData(), blocksparse_tensors=None, mCuTotalMBlocks=None,
                 stream=None):
        """Upstream's host code; under `deterministic` the host's counters reach upstream's kernel as the last of its
        aux tensors (dQ's, then dK/dV's with GQA), which compute_one_m_block takes back off."""
        self.ordered_dkv = False  # whether a KV head's query heads take turns on dK/dV (GQA, not packed)
        if cutlass.const_expr(self.deterministic):
            assert mdQ_semaphore is not None, "deterministic: the host allocates the dQ counters (deterministic=True)"
            aux_data = with_last_tensor(aux_data, mdQ_semaphore)
            if cutlass.const_expr(mdK_semaphore is not None and not self.pack_gqa):
                aux_data = with_last_tensor(aux_data, mdK_semaphore)
                self.ordered_dkv = True
        FlashAttentionBackwardSm120.__call__(
            self, mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, softmax_scale, mCuSeqlensQ, mCuSeqlensK,
            mSeqUsedQ, mSeqUsedK, window_size_left, window_size_right, None, None, None, aux_data,
            blocksparse_tensors, mCuTotalMBlocks, stream,
        )

    def compute_one_m_block(self, m_block, *args, mask_fn=None, aux_data: AuxData = AuxData(), **kwargs):
        body = FlashAttentionBackwardSm120.compute_one_m_block
        if not self.deterministic:
            return body(self, m_block, *args, mask_fn=mask_fn, aux_data=aux_data, **kwargs)
        dkv = None
        if self.ordered_dkv:
            aux_data, dkv = without_last_tensor(aux_data)
        aux_data, dq = without_last_tensor(aux_data)
        self.semaphores_traced = (dq, dkv)  # the epilogue's, traced after the query blocks
        where = mask_fn.keywords  # upstream's kernel binds the tile's key block, batch and head there
        lock = utils.elem_pointer(dq, (where["batch_idx"], where["head_idx"], m_block, 0))
        ordered = _OrderedDQ(flash_bwd.sm80_utils, kwargs["mma_params"].tdQrK, lock, where["n_block"])
        flash_bwd.sm80_utils = ordered
        try:
            body(self, m_block, *args, mask_fn=mask_fn, aux_data=aux_data, **kwargs)
        finally:
            flash_bwd.sm80_utils = ordered.helpers
        if ordered.pending:  # dQ's adds were the body's last work (one Q stage: the dK gemm came first)
            ordered.release()

    @cute.jit
    def epilogue(self, acc_dK, acc_dV, mdK, mdV, sdK, sdV, gmem_tiled_copy_dK, gmem_tiled_copy_dV, tiled_mma, tidx,
                 n_block, num_head, batch_size, seqlen, d_head, d_head_v):
        # batch_size is the batch index here (upstream's name); the epilogue adds batch_idx * n_block_size back.
        if cutlass.const_expr(self.qhead_per_kvhead > 1 and seqlen.has_cu_seqlens_k):
            seqlen = dataclasses.replace(seqlen, offset_k=seqlen.padded_offset_k - batch_size * self.n_block_size)
        if cutlass.const_expr(self.ordered_dkv):  # the KV head's query heads add their dK and dV in head order
            lock = utils.elem_pointer(self.semaphores_traced[1],
                                      (batch_size, num_head // self.qhead_per_kvhead, n_block, 0))
            acquire_turn(lock, num_head % self.qhead_per_kvhead)
        FlashAttentionBackwardSm120.epilogue(self, acc_dK, acc_dV, mdK, mdV, sdK, sdV, gmem_tiled_copy_dK,
                                             gmem_tiled_copy_dV, tiled_mma, tidx, n_block, num_head, batch_size,
                                             seqlen, d_head, d_head_v)
        if cutlass.const_expr(self.ordered_dkv):
            release_turn(lock)
