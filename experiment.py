"""experiment.py: the file a coding agent edits (see program.md).

The per-problem-class dispatch tables, the call path the harness times (`attention`, through fa4tune.api) and the
agent's own kernel classes (a class defined here joins kernels/' classes under the `name` it declares). The harness,
timing, correctness gate, metric lines and results.tsv live in prepare.py and fa4tune/: the agent does not edit them.

    uv run python experiment.py > run.log          # GPU present: gate + time the dispatch table
    uv run python experiment.py --static > run.log # no GPU needed: compile for sm_120a, read cubins
"""

# No `from __future__ import annotations`: the CuTe DSL reads annotations (cute.struct, cutlass.Constexpr) at run time.

if __name__ == "__main__":
    # --help and bad input are answered before the imports below; then this file is checked, imported, and run.
    from fa4tune.cli import experiment_main

    raise SystemExit(experiment_main(__file__))

from dataclasses import replace
from types import SimpleNamespace

from fa4tune import api
from fa4tune.config import BackwardConfig, ForwardConfig
from fa4tune.kernel_class import backward_kernel, forward_kernel
from fa4tune.verdict import OK, Verdict
from kernels.backward_sm120 import BackwardSm120
from kernels.cmask_backward_sm120 import CausalAnyWarpsBackwardSm120

# ---------------------------------------------------------------------------------------------
# Kernel classes: one defined here is tunable once it declares `name` (its configs' `kernel` value), `knobs` (its
# constructor knobs and their domains), `limits`, `smem_bytes` and `can_implement`, as kernels/tma_forward_sm120.py
# does. Subclass TunedForwardSm120 (upstream's), TmaForwardSm120 or SplitKvForwardSm120 (kernels/) forward, and
# BackwardSm120 (upstream's) or CausalAnyWarpsBackwardSm120 (imported above) backward; knobs reach the constructor.
# ---------------------------------------------------------------------------------------------


def kernel_class(config) -> type:
    """The kernel class that runs a config: the forward or backward class its `kernel` knob names."""
    if isinstance(config, BackwardConfig):
        return backward_kernel(config.kernel, __name__)  # this module's classes, under whatever name it was loaded
    return forward_kernel(config.kernel, __name__)


# ---------------------------------------------------------------------------------------------
# Dispatch tables: problem class name -> config; a class without an entry takes its nearest tuned class's where
# feasible (fa4tune/fallback.py: same head dims, mask, regime; nearest GQA ratio; fp16 <-> bf16), else upstream's.
# `python -m search apply` rewrites entries with confirmed winners; why each is what it is: docs/results.md.
# ---------------------------------------------------------------------------------------------

PREFILL = ForwardConfig(tile_m=128, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=False)  # upstream's tiles
TRIMMED = replace(PREFILL, kernel="sm120_tma_trimmed")  # paired longest-first TMA, masked PV trimmed
DECODE = ForwardConfig(tile_m=32, tile_n=64, num_threads=64, num_stages=2, Q_in_regs=False, kernel="sm120_splitkv",
                       extra={"num_splits": 0})  # split-KV, the heuristic's split count
SMALL_DECODE = replace(DECODE, tile_m=16, tile_n=32, num_threads=32, num_stages=1, Q_in_regs=True)  # soft-caps: s16

FORWARD_DISPATCH: dict[str, ForwardConfig] = {
    "d128-noncausal-bf16": replace(PREFILL, tile_m=64, Q_in_regs=True),
    "d128-causal-bf16": replace(PREFILL, tile_m=64, Q_in_regs=True),
    "d96-noncausal-bf16": PREFILL,
    "d96-causal-bf16": replace(TRIMMED, tile_m=64, tile_n=96),
    "d64-noncausal-bf16": replace(PREFILL, tile_n=128),
    "d64-causal-bf16": replace(TRIMMED, Q_in_regs=True),
    "d128-causal-gqa4-bf16": replace(TRIMMED, tile_m=64, Q_in_regs=True),  # see GQA 2 below
    "d128-noncausal-gqa4-bf16": PREFILL,
    "d64-noncausal-decode-bf16": DECODE,
    "d64-noncausal-gqa4-decode-bf16": DECODE,
    "d64-noncausal-gqa8-decode-bf16": replace(DECODE, tile_n=96, num_stages=3),
    "d64-causal-decode-bf16": DECODE,
    "d64-causal-gqa4-decode-bf16": DECODE,
    "d64-causal-gqa8-decode-bf16": DECODE,
    "d96-noncausal-decode-bf16": replace(DECODE, tile_n=32),
    "d96-noncausal-gqa4-decode-bf16": DECODE,
    "d96-noncausal-gqa8-decode-bf16": DECODE,
    "d96-causal-decode-bf16": replace(DECODE, num_stages=1, Q_in_regs=True),
    "d96-causal-gqa4-decode-bf16": replace(DECODE, tile_n=96),
    "d96-causal-gqa8-decode-bf16": replace(DECODE, tile_n=96),
    "d128-noncausal-decode-bf16": DECODE,
    "d128-noncausal-gqa4-decode-bf16": DECODE,
    "d128-noncausal-gqa8-decode-bf16": DECODE,
    "d128-causal-decode-bf16": DECODE,
    "d128-causal-gqa4-decode-bf16": DECODE,
    "d128-causal-gqa8-decode-bf16": DECODE,
    "d128-causal-chunked-bf16": replace(TRIMMED, tile_m=64, tile_n=96, Q_in_regs=True),
    "d128-causal-gqa4-chunked-bf16": replace(TRIMMED, tile_m=64, tile_n=96, Q_in_regs=True),
    "d96-causal-chunked-bf16": TRIMMED,
    "d64-causal-chunked-bf16": replace(TRIMMED, Q_in_regs=True),
    "d64-noncausal-fp16": replace(PREFILL, tile_n=128, kernel="sm120_tma"),  # 2026-12-06-h200-table44-and-twins.md
    # d128 causal GQA 2-8 (GQA 5/7, fp16 by fallback): 1.01-1.02x the twins: 2026-12-06-h100-models-opaque-fp8-wide.md
    "d128-causal-gqa2-bf16": replace(TRIMMED, tile_m=64, Q_in_regs=True),
    "d128-causal-gqa8-bf16": replace(TRIMMED, tile_m=64, Q_in_regs=True),
    "d256-causal-gqa2-bf16": replace(PREFILL, tile_n=32, num_threads=256, kernel="sm120_tma_lpt"),  # 1.28x sm120_tma's
    "d256-causal-gqa2-decode-bf16": replace(DECODE, tile_m=64, tile_n=32, num_threads=128, num_stages=1),  # 4x, study
    "d128-causal-gqa4-window-bf16": replace(PREFILL, tile_m=64, Q_in_regs=True, kernel="sm120_tma"),  # 2026-12-07-h200-s14
    "d128-causal-gqa2-window-softcap-bf16": replace(TRIMMED, tile_m=64, tile_n=32),  # 2.30x, 2026-12-07-h100-s15
    "d128-causal-gqa2-softcap-bf16": replace(TRIMMED, tile_m=64, tile_n=32),  # 1.91x (Q in regs: not SM120's occupancy)
    "d64-causal-gqa8-window-bf16": replace(TRIMMED, tile_m=64, tile_n=32, Q_in_regs=True),  # 10.6x, gpt-oss sliding
    "d128-causal-gqa4-window-decode-bf16": DECODE,  # split-KV over the window: 5.7x, Gemma 3's (GQA 2) 85x
    "d128-noncausal-gqa4-page16-decode-bf16": replace(DECODE, tile_n=32, num_stages=1, Q_in_regs=True),  # 1.05x
    "d128-causal-gqa2-softcap-decode-bf16": SMALL_DECODE,  # Gemma 2 27B global: 8.6x, 1.8x DECODE
    "d128-causal-gqa2-window-softcap-decode-bf16": SMALL_DECODE,  # Gemma 2 27B local: 4.1x (b16) to 21x (b4 32k)
    "d64-causal-gqa8-window-decode-bf16": replace(PREFILL, tile_m=32, tile_n=32, num_threads=64, num_stages=3,
                                                  kernel="sm120_tma"),  # gpt-oss sliding decode 32x, 1.29x DECODE
}

BWD = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_stages_dO=1, num_threads=128, SdP_swapAB=False,
                     dKV_swapAB=False, dQ_swapAB=False, AtomLayoutMSdP=2, AtomLayoutNdKV=2, AtomLayoutMdQ=2, V_in_regs=False)

CMASK8 = replace(BWD, kernel="sm120_cmask", num_threads=256, AtomLayoutMSdP=4)  # 8 warps, causal: 2026-12-06-h100-cmask-sweep.md
CMASK4 = replace(BWD, kernel="sm120_cmask", num_stages_Q=1, dQ_swapAB=True)  # 4 warps 2 x 2, causal: 2026-12-06-h200-table44-and-twins.md
# K in registers for dQ (d128, GQA 4, d64 causal), 1.007-1.025x the coordinate-mask entries: 2026-12-06-h100-models-twins-varlen.md
BACKWARD_DISPATCH: dict[str, BackwardConfig] = {
    "d128-noncausal-bf16": replace(BWD, m_block_size=32, n_block_size=128, num_stages_Q=1, num_threads=256, AtomLayoutNdKV=4,
                                   kernel="sm120_edge"),  # 1.004-1.015x sm120: 2026-12-06-h100-s7-twins-ut.md
    "d128-causal-bf16": replace(CMASK8, dQ_swapAB=True, kernel="sm120_cmask_kregs"),
    # d96 non-causal: its study's winner, 1.008-1.016x the entry before it: 2026-12-07-h100-s10-twins-d128-study.md
    "d96-noncausal-bf16": replace(BWD, num_stages_Q=1, dQ_swapAB=True, kernel="sm120_edge"),
    "d96-causal-bf16": CMASK4,
    "d64-noncausal-bf16": replace(BWD, num_stages_dO=2, kernel="sm120_edge"),  # 1.011-1.014x sm120: 2026-12-06-h100-s8-edge-ut-gqa4.md
    "d64-causal-bf16": replace(CMASK4, kernel="sm120_cmask_kregs"),
    "d128-causal-gqa4-bf16": replace(CMASK8, kernel="sm120_cmask_kregs"),
    "d192v128-causal-bf16": replace(BWD, kernel="sm120_cmask_kregs", num_stages_Q=1, num_threads=256, dQ_swapAB=True,
                                    AtomLayoutNdKV=4),  # 248 regs; upstream's spills 1.5 KB on sm_120a, 30 KB on sm_90a
    "d128-causal-gqa4-window-bf16": replace(BWD, num_stages_Q=1, AtomLayoutMSdP=4, AtomLayoutNdKV=1, AtomLayoutMdQ=1),
    "d128-causal-gqa2-softcap-bf16": replace(BWD, AtomLayoutMSdP=4, AtomLayoutNdKV=1),  # 1.10x, study (Gemma 2 27B)
    "d64-causal-gqa8-window-bf16": replace(BWD, num_stages_Q=1, AtomLayoutMSdP=4),  # 1.13x, 2026-12-07-h100-s15
}

# The backward preprocess kernel's thread count per problem class (upstream's 256 where absent); timed apart from
# the search: docs/measurements/2026-12-01-h200-preprocess-threads.md
BACKWARD_PREPROCESS_THREADS: dict[str, int] = {}

# Packed (varlen) calls' forward per class, on a class that runs packed batches (kernel "sm120"); a class without one
# runs its entry where that class runs packed batches, else upstream's default: 2026-12-05-h100-varlen-gqa-backward.md
VARLEN_DISPATCH: dict[str, ForwardConfig] = {
    "d128-causal-gqa4-bf16": replace(PREFILL, tile_m=64, Q_in_regs=True),
    "d128-causal-gqa8-fp16": replace(PREFILL, tile_m=64, Q_in_regs=True),
}

TABLES = api.DispatchTables(FORWARD_DISPATCH, BACKWARD_DISPATCH, BACKWARD_PREPROCESS_THREADS, kernel_class,
                            varlen=VARLEN_DISPATCH)


# A problem class's configs: its entry, else its nearest tuned class's, else upstream's (the preprocess: else 256
# threads); a packed call's forward: its varlen entry, then api's rule. Rebind any of these to change the lookup.
forward_config, backward_config = TABLES.forward_config, TABLES.backward_config
preprocess_threads, varlen_forward_config = TABLES.preprocess_threads, TABLES.varlen_forward_config


# ---------------------------------------------------------------------------------------------
# attention(): what the harness gates and times. It looks each problem's configs up through this module's
# functions above (override any of them, or attention itself, to change the call path).
# ---------------------------------------------------------------------------------------------


def attention(q, k, v, causal=False, softmax_scale=None, fwd_config=None, bwd_config=None, return_lse=False, **packed):
    """softmax(q k^T * scale) v through the SM120 kernels (fa4tune.api; `packed`: a varlen call's cu_seqlens and max
    seqlens, or fp8=True for the opt-in FP8 forward); configs default to this file's dispatch entries, gradients flow
    through the tuned backward kernel."""
    tables = SimpleNamespace(forward_config=forward_config, backward_config=backward_config, kernel_class=kernel_class,
                             varlen_forward_config=varlen_forward_config, preprocess_threads=preprocess_threads)
    return api.attention(q, k, v, causal, softmax_scale, fwd_config, bwd_config, return_lse, tables=tables, **packed)
