"""The TMA-fed SM120 forward with warp pairs (kernel "sm120_tma_pairs"): two warps share each 32 query rows, one taking
half of every K/V block's keys in S = QK^T and half of the head dim in O += PV.

Why: upstream's SM80 layout gives each warp 16 query rows and the whole K and V block. Every warp reads the whole K
and V tile from shared memory with ldmatrix for 16 rows of MMAs: 16 FLOP per byte read, and at 64x96 tiles the TMA
forward runs near the SM's shared-memory bandwidth (docs/measurements/2026-12-03-h200-lazy-rescale.md). 32 rows a warp
would halve those reads, but at head_dim 128 32 rows of O and Q do not fit one thread's registers. Here the 4 warps
of a 64-row tile form a 2 x 2 grid (rows x keys for S, rows x head dim for O): a warp holds 32 rows of Q (registers),
S for 32 rows x half the keys, O for 32 rows x half the head dim, so each warp reads half of K and half of V:
  - S: warp (i, j) computes rows i x keys j (MMA tiles of 16 keys a warp); the row max is the larger of the pair's two
    (exchanged through a small fp32 buffer, `row stats`), so both warps of a pair keep the same running max;
  - P (the probabilities in the input dtype) goes to shared memory (`sP`, tile_m x tile_n): warp (i, j) needs P for
    all keys of its rows in O += P V, where it reads V for all keys and its half of the head dim;
  - each warp keeps the row sums of its own keys; the pair adds them once, before upstream's finalize.
Per KV block a CTA reads tile_n x head_dim x 2 B of K and as many of V in total per warp pair (not per warp), plus
P: at 64x64 tiles 88 KB instead of 128 KB. It costs a CTA barrier more per block (the P exchange; the row-max
exchange shares the V wait's barrier with one stage) and the sP and row-stats buffers.

Everything else is TmaForwardSm120's: the TMA loads on mbarriers, the masks, the epilogue (upstream's, which
partitions O by the PV MMA, any layout), GQA packing.

Measured (docs/measurements/2026-12-04-h200-tma-pairs.md, H200 with SM120 kernels emulated): correct on the gate
matrix, and 5-15 % slower than the table on the chunked suite (about 5 % slower than the TMA class at the same
64x64 tile): the extra barrier and P's round trip cost more than the reads saved. Hence `searched = False`.
Only one stage was gated; two stages compile (sm_120a, 64x64 t128: 158 registers, 90,664 B, 1 CTA per SM).
"""

# No `from __future__ import annotations` here: the CuTe DSL reads annotations at run time.
import operator
from types import SimpleNamespace
from typing import Callable, Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warp
from flash_attn.cute import ampere_helpers as sm80_utils
from flash_attn.cute import utils
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.softmax import Softmax
from flash_attn.cute.utils import AuxData
from quack import layout_utils

from fa4tune.feasibility import OK, Verdict
from fa4tune.kernel_class import Limits
from kernels.tma_forward_sm120 import TmaForwardSm120
from kernels.tuned_forward_sm120 import tile_bytes

WARPS_N = 2  # warps of a pair: across the keys of S and the head dim of O
# each warp's half of the keys (S) and of the head dim (O) must be a multiple of 32 columns: at head_dim 96 (halves of
# 48) the DSL's compiler aborts (SIGABRT in the compile process, seen on the H200 with 64x64 and 128x64 tiles)
HALF_MULTIPLE = 32
PAIR_N = WARPS_N * HALF_MULTIPLE  # tile_n and the head dims must be multiples of this
STAT_BYTES = 4  # fp32 row max / row sum per (row, warp of the pair)


class TmaPairsForwardSm120(TmaForwardSm120):
    """TmaForwardSm120 with a (num_warps / 2) x 2 warp grid: warp pairs split S's keys and O's head dim."""

    name = "sm120_tma_pairs"
    limits = Limits(num_stages=(1, 2), num_threads=(128, 256))
    searched = False  # slower than the table everywhere it was timed (see the module's docstring)

    @classmethod
    def smem_bytes(cls, config, problem_class) -> tuple[int, str]:
        """TmaForwardSm120's tiles and mbarriers, then P (tile_m x tile_n, whole KBs) and the pair's row stats."""
        base, breakdown = super().smem_bytes(config, problem_class)
        p = tile_bytes(config.tile_m, config.tile_n)
        stats = config.tile_m * WARPS_N * STAT_BYTES
        return base + p + stats, f"{breakdown} + P {p} + row stats {stats} B"

    @classmethod
    def can_implement(cls, config, problem_class, target) -> Verdict:
        """TmaForwardSm120's rules (rows: num_warps/2 warp rows of 32 make tile_m*2 a multiple of num_threads, the
        same rule), then the pair's: tile_n and the head dims split in halves of a multiple of 32."""
        verdict = super().can_implement(config, problem_class, target)
        if not verdict:
            return verdict
        if config.tile_n % PAIR_N:
            return Verdict(False, "pairs_tile_n_multiple",
                           f"tile_n={config.tile_n} is not a multiple of {PAIR_N} (each warp of a pair takes half of "
                           f"the keys, a multiple of {HALF_MULTIPLE})")
        for name, dim in (("head_dim", problem_class.head_dim), ("head_dim_v", problem_class.head_dim_v)):
            if dim % PAIR_N:
                return Verdict(False, "pairs_head_dim_multiple",
                               f"{name}={dim} is not a multiple of {PAIR_N} (each warp of a pair takes half of O's "
                               f"columns, a multiple of {HALF_MULTIPLE})")
        return OK

    @staticmethod
    def halves(n: int) -> cute.Layout:
        """The N permutation that gives warp j of a pair the contiguous columns [j*n/2, (j+1)*n/2): the MMA's N index
        (8 columns of an atom, then the 2 warps, then the repeats) to the column. A thread's columns are then 8 apart
        in each n8 tile, as in upstream's layout, which the masks' register-to-predicate trick assumes (an interleaved
        layout, 8 columns a warp in turn, masked the wrong columns: gate failures on every causal problem)."""
        return cute.make_layout((8, WARPS_N, n // (8 * WARPS_N)), stride=(1, n // WARPS_N, 8))

    def _get_tiled_mma(self):
        """(num_warps / 2) x 2 warps: each warp 32 rows (two MMA tiles of 16) and half of S's keys / O's head dim."""
        warps_m = self.num_threads // 32 // WARPS_N
        atom = warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16))
        tiled_mma_qk = cute.make_tiled_mma(atom, (warps_m, WARPS_N, 1),
                                           permutation_mnk=(warps_m * 16, self.halves(self.tile_n), 16))
        tiled_mma_pv = cute.make_tiled_mma(atom, (warps_m, WARPS_N, 1),
                                           permutation_mnk=(warps_m * 16, self.halves(self.tile_hdimv), 16))
        return tiled_mma_qk, tiled_mma_pv

    def _get_shared_storage_cls(self):
        # TmaForwardSm120's tiles (whole KBs from a 1024-B aligned base), P (whole KBs, so that it starts aligned
        # too), the row stats, then the mbarriers
        tile = self.tile_struct
        sQ_struct, sK_struct, sV_struct = (tile(cute.cosize(layout)) for layout in (self.sQ_layout, self.sK_layout, self.sV_layout))
        sP_struct = tile(self.tile_m * self.tile_n)  # P's swizzled layout (made in the kernel) is tile_m x tile_n, dense
        sQV_struct = tile(max(cute.cosize(self.sQ_layout), cute.cosize(self.sV_layout)))
        stat_struct = cute.struct.MemRange[Float32, self.tile_m * WARPS_N]
        mbar_struct = cute.struct.MemRange[cutlass.Int64, self.num_mbarriers(self.num_stages)]

        @cute.struct
        class SharedStorageQKV:
            sV: sV_struct
            sQ: sQ_struct
            sK: sK_struct
            sP: sP_struct
            sStat: stat_struct
            mbar: mbar_struct

        @cute.struct
        class SharedStorageSharedQV:
            sQ: sQV_struct
            sK: sK_struct
            sP: sP_struct
            sStat: stat_struct
            mbar: mbar_struct

        return SharedStorageQKV if const_expr(not self.Q_in_regs) else SharedStorageSharedQV

    def mainloop_extras(self, storage, tidx: Int32, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma):
        """P's buffer with its store (S's partition) and load (the PV MMA's A operand), the row-stats buffer
        (tile_m x 2 fp32), this thread's row coordinates, and which warp of its pair it is."""
        # P's layout is made here, in the kernel (a layout the host code made would be a value of the host function)
        sP_layout = cute.tile_to_shape(sm80_utils.get_smem_layout_atom(self.dtype, self.tile_n), (self.tile_m, self.tile_n), (0, 1))
        sP = storage.sP.get_tensor(sP_layout)
        sStat = storage.sStat.get_tensor(cute.make_layout((self.tile_m, WARPS_N)))
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        store_atom = utils.get_smem_store_atom(self.arch.major * 10 + self.arch.minor, self.dtype)
        smem_thr_store_P = cute.make_tiled_copy_C(store_atom, tiled_mma_qk).get_slice(tidx)
        load_atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        smem_thr_copy_P = utils.make_tiled_copy_A(load_atom, tiled_mma_pv).get_slice(tidx)
        tScS = layout_utils.reshape_acc_to_mn(thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n))))
        first_col = tScS[0, 0][1]
        # the rows' coordinates, made here once: a coordinate first read inside a branch of the mainloop would be a
        # value of that branch, cached in the tensor and reused where the branch's values are out of scope
        rows = [tScS[r, 0][0] for r in range(cute.size(tScS, mode=[0]))]
        return SimpleNamespace(
            store_atom=store_atom, smem_thr_store_P=smem_thr_store_P, tPsP=smem_thr_store_P.partition_D(sP),
            smem_thr_copy_P=smem_thr_copy_P, tOsP=smem_thr_copy_P.partition_S(sP),
            tOrP=thr_mma_pv.make_fragment_A(thr_mma_pv.partition_A(sP)),
            sStat=sStat, rows=rows,
            col=first_col // (self.tile_n // WARPS_N),  # warp j of a pair holds keys [j*tile_n/2, (j+1)*tile_n/2)
            first_of_quad=first_col % 8 == 0,  # the thread of each row's quad that carries the pair's row sum
        )

    @cute.jit
    def publish_row_max(self, acc_S: cute.Tensor, softmax: Softmax, pair: SimpleNamespace, local_max: cute.Tensor,
                        is_first: cutlass.Constexpr[bool]):
        """This warp's row maxes over its keys (and the running max) into `local_max` and the row-stats buffer."""
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        for r in cutlass.range_constexpr(cute.size(softmax.row_max)):
            row_max = utils.fmax_reduce(acc_S_mn[r, None].load(),
                                        init_val=softmax.row_max[r] if const_expr(not is_first) else None, arch=80)
            local_max[r] = cute.arch.warp_reduction_max(row_max, threads_in_group=4)
            # the quad's 4 threads write the same value (a branch on the thread here breaks the DSL's IR: the
            # value would be scoped to the branch in the first block's step and reused in the loop's)
            pair.sStat[pair.rows[r], pair.col] = local_max[r]

    @cute.jit
    def pair_online_softmax(self, acc_S: cute.Tensor, softmax: Softmax, pair: SimpleNamespace, local_max: cute.Tensor,
                            is_first: cutlass.Constexpr[bool], check_inf: cutlass.Constexpr[bool]) -> cute.Tensor:
        """Upstream's online softmax with the pair's row max (after the barrier that published both warps' maxes):
        P = exp2(S * scale - max * scale) in place, this warp's row sums, and O's row scale."""
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        row_scale = cute.make_fragment_like(softmax.row_max, Float32)
        scale_log2 = softmax.scale_log2
        for r in cutlass.range_constexpr(cute.size(softmax.row_max)):
            row_max_cur = utils.fmax(local_max[r], pair.sStat[pair.rows[r], WARPS_N - 1 - pair.col])
            row_max_prev = softmax.row_max[r]
            softmax.row_max[r] = row_max_cur
            if const_expr(check_inf):
                row_max_cur = 0.0 if row_max_cur == -Float32.inf else row_max_cur
            acc_S_row_exp = cute.math.exp2(acc_S_mn[r, None].load() * scale_log2 - row_max_cur * scale_log2, fastmath=True)
            if const_expr(is_first):
                row_scale[r] = 1.0
                softmax.row_sum[r] = utils.fadd_reduce(acc_S_row_exp, init_val=None, arch=80)
            else:
                row_scale[r] = cute.math.exp2((row_max_prev - row_max_cur) * scale_log2, fastmath=True)
                softmax.row_sum[r] = utils.fadd_reduce(acc_S_row_exp, init_val=softmax.row_sum[r] * row_scale[r], arch=80)
            acc_S_mn[r, None].store(acc_S_row_exp)
        return row_scale

    @cute.jit
    def finalize_softmax(self, softmax: Softmax, mma_params: SimpleNamespace) -> cute.Tensor:
        """The pair's row sums added (each warp summed its own keys), then upstream's finalize. Upstream's finalize
        adds a row's sum over its quad: the quad's first thread carries the pair's total, the other three 0."""
        pair = mma_params.extra
        quad_sum = cute.make_fragment_like(softmax.row_sum, Float32)
        quad_sum.store(utils.warp_reduce(softmax.row_sum.load(), operator.add, width=4))
        for r in cutlass.range_constexpr(cute.size(softmax.row_sum)):
            pair.sStat[pair.rows[r], pair.col] = quad_sum[r]  # the same value from the quad's 4 threads
        cute.arch.barrier()  # every warp's sums published (the last block's max reads ended at its P barrier)
        for r in cutlass.range_constexpr(cute.size(softmax.row_sum)):
            other = pair.sStat[pair.rows[r], WARPS_N - 1 - pair.col]
            softmax.row_sum[r] = quad_sum[r] + other if pair.first_of_quad else Float32(0.0)
        return softmax.finalize()

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
    ):
        """One n_block in TmaForwardSm120's load schedule: S for this warp's keys, the pair's row max exchanged
        (with one stage, through the V wait's barrier), P to shared memory, a barrier, O += P V for this warp's
        columns of the head dim."""
        pair = mma_params.extra
        num_stages = self.num_stages
        stage = iteration % num_stages if const_expr(num_stages > 1) else Int32(0)
        phase = (iteration // num_stages) % 2 if const_expr(num_stages > 1) else iteration % 2
        acc_S = cute.make_rmem_tensor(mma_params.thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S.fill(0.0)
        wait_K(stage, phase)  # K of this block; everyone is done with the previous block's V, P and row stats
        if const_expr(num_stages == 1):
            load_V(n_block, 0)
        elif n_block - num_stages + 1 >= 0:
            load_V(n_block - num_stages + 1, (iteration + num_stages - 1) % num_stages)
        self.gemm_QK(acc_S, stage, n_block, mma_params, smem_copy_params, softmax, seqlen, batch_idx, head_idx, m_block,
                     aux_data, fastdiv_mods)
        if const_expr(mask_fn is not None):
            mask_fn(acc_S, n_block=n_block)
        local_max = cute.make_fragment_like(softmax.row_max, Float32)
        self.publish_row_max(acc_S, softmax, pair, local_max, is_first_n_block)
        if const_expr(num_stages == 1):
            wait_V(stage, phase)  # V of this block; its barrier also publishes the row maxes; K's buffer is free
            if n_block - 1 >= 0:
                load_K(n_block - 1, 0)
        else:
            cute.arch.barrier()  # the row maxes published
        row_scale = self.pair_online_softmax(acc_S, softmax, pair, local_max, is_first_n_block, check_inf)
        softmax.rescale_O(mma_params.acc_O, row_scale)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        cute.copy(pair.store_atom, pair.smem_thr_store_P.retile(rP), pair.tPsP)
        if const_expr(num_stages > 1):
            wait_V(stage, phase)  # its barrier also publishes P
            if n_block - num_stages >= 0:
                load_K(n_block - num_stages, stage)
        else:
            cute.arch.barrier()  # P published
        sm80_utils.gemm(
            mma_params.thr_mma_pv, mma_params.acc_O, pair.tOrP, mma_params.tOrVt, pair.tOsP,
            smem_copy_params.tOsVt[None, None, None, stage], pair.smem_thr_copy_P, smem_copy_params.smem_thr_copy_V,
        )
