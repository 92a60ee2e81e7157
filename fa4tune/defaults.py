"""Upstream's current SM120 settings, read from the pinned flash-attn-4's own config code (fa4tune.upstream), as our
configs; and ours for head dims whose upstream tiles do not fit SM120's shared memory.

The baseline every tuned config is compared with, and the seed of experiment.py's dispatch tables.

Head dims past 128 (Gemma's 256, DeepSeek's 192/128): upstream's SM120 tiles are keyed on head_dim only, so at d256
its forward asks for 131072 B (Q 65536 + K 32768 + V 32768) and its backward for 148480 B of the 101376 B a block
may have; upstream then fails its own can_implement. `wide_forward` / `wide_backward` are the configs a class runs
when upstream's do not fit (fa4tune.fallback, step 4), chosen from the sm_120a compiles of every feasible config
(docs/measurements/2026-12-05-wide-head-dims.md): the forward's 128x32 tile with 8 warps on our TMA class (no
spills at d256, GQA 1 and 2, bf16 and fp16; upstream's class spills 40 B at d256 causal GQA 2 bf16); the backward's
32x32 blocks with two Q stages, no spills at d256 non-causal.
"""

from fa4tune import upstream
from fa4tune.config import FP8, BackwardConfig, ForwardConfig, ProblemClass

UPSTREAM_KERNEL = "sm120"  # the kernel class that runs upstream's SM120 forward code (kernels/tuned_forward_sm120.py)


def upstream_forward(pc: ProblemClass) -> ForwardConfig:
    """Upstream's SM120 forward: the tile of its `select_initial_fwd_tile` (b40: 128x128 for head_dim <= 64, else
    128x64) and the threads, stages and Q_in_regs its interface passes the SM120 class (128, 1, False)."""
    tile_m, tile_n = upstream.sm120_forward_tile(pc.head_dim, pc.head_dim_v, pc.causal, pc.qhead_per_kvhead)
    return ForwardConfig(tile_m=tile_m, tile_n=tile_n, **upstream.SM120_FWD_KNOBS)


def upstream_backward(pc: ProblemClass) -> BackwardConfig:
    """Upstream's one SM120 backward (its `sm120_bwd_fields`; b40: 64x64 blocks, 2 stages if head_dim <= 64 else 1,
    atom layouts 4, 128 threads)."""
    fields = upstream.sm120_backward_fields(pc.head_dim, pc.head_dim_v, pc.causal, pc.qhead_per_kvhead)
    return BackwardConfig(**{name: fields[name] for name in BackwardConfig.__dataclass_fields__ if name in fields})


def wide_forward(pc: ProblemClass) -> ForwardConfig:
    """Ours where upstream's forward tiles do not fit: 128x32, 256 threads, 1 stage, TMA loads (sm_120a at d256:
    232-237 registers, no spills, 98328 B, one CTA of 8 warps per SM)."""
    return ForwardConfig(tile_m=128, tile_n=32, num_threads=256, num_stages=1, Q_in_regs=False, kernel="sm120_tma")


def wide_backward(pc: ProblemClass) -> BackwardConfig:
    """Ours where upstream's backward blocks do not fit: 32x32, Q in two stages, the S/dP MMA's 4 warps 2 x 2 and
    dK/dV's and dQ's 4 x 1 (sm_120a at d256 non-causal: 255 registers, no spills, 87040 B). Causal at d256 fails
    the causal rules (fa4tune.feasibility): with 4 warps the S/dP warps must all lie along m."""
    return BackwardConfig(
        m_block_size=32, n_block_size=32, num_stages_Q=2, num_stages_dO=1, num_threads=128,
        SdP_swapAB=False, dKV_swapAB=False, dQ_swapAB=False,
        AtomLayoutMSdP=2, AtomLayoutNdKV=1, AtomLayoutMdQ=1, V_in_regs=False,
    )


def fp8_forward(pc: ProblemClass) -> ForwardConfig:
    """The FP8 forward's tiles where an fp8 class has no entry (upstream has no FP8 path on SM120): 64 x 64 in two
    stages, 128 threads. Timed against 128 x 64 (x 128 at d64) in one stage on the standard prefill shapes, all gated
    (docs/measurements/2026-12-06-h100-models-opaque-fp8-wide.md section 3): it led every causal, d64 and d96
    shape by 3-26 % and trailed d128 non-causal by 2-3 %, where 128 x 64 spills 124 B on sm_120a and it does not;
    the d128 causal GQA 4 study chose it too."""
    # P V in bf16: FP8 P V (the class's knob pv_fp8) passes the gate but runs 0.85x on an H100, whose e4m3 mma.sync is
    # lowered to 0.64x bf16's rate (2026-12-06-h100-s5-fp8pv-cta-ut1.md section 1); on SM120, where e4m3 runs at
    # twice bf16's rate, an FP8 study chooses it
    return ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, Q_in_regs=False, kernel="sm120_fp8",
                         extra={"pv_fp8": False})


PAGED_KERNEL = "sm120_splitkv"  # the class that runs a paged KV cache (kernels/splitkv_forward_sm120.py: "paged")


def paged_forward(pc: ProblemClass) -> ForwardConfig:
    """Ours where a paged class (a paged KV cache) has no entry that runs pages: the split-KV class, the split count
    its heuristic's. A decode takes the decode entries' tiles (32x64, 2 warps, 2 stages: experiment.py's DECODE, the
    split-KV study's); a chunked or prefill chunk 64x64 with 4 warps in 2 stages (Q 16 KB + K and V 64 KB at d128,
    no spills on sm_120a); head dims past 128 the d256 decode entry's 64x32 in one stage."""
    if pc.head_dim > 128 or pc.head_dim_v > 128:
        return ForwardConfig(tile_m=64, tile_n=32, num_threads=128, num_stages=1, kernel=PAGED_KERNEL, extra={"num_splits": 0})
    if pc.regime == "decode":
        return ForwardConfig(tile_m=32, tile_n=64, num_threads=64, num_stages=2, kernel=PAGED_KERNEL, extra={"num_splits": 0})
    return ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2, kernel=PAGED_KERNEL, extra={"num_splits": 0})


def fallback_configs(direction: str, pc: ProblemClass) -> tuple:
    """Steps 3 and 4 of the fallback rule (fa4tune.fallback) for 'fwd' or 'bwd': (rule, config), in the order tried;
    an fp8 class has the FP8 forward's default and no backward; a paged class ours for paged KV (upstream's SM120
    classes run no pages) and no backward."""
    if pc.page_size:
        return (("paged", paged_forward(pc)),) if direction == "fwd" else (("upstream", upstream_backward(pc)),)
    if pc.dtype == FP8:
        # no backward: upstream's, refused for the class by the static rules (fp8_forward_only), says so
        return (("fp8", fp8_forward(pc)),) if direction == "fwd" else (("upstream", upstream_backward(pc)),)
    if direction == "fwd":
        return (("upstream", upstream_forward(pc)), ("wide", wide_forward(pc)))
    return (("upstream", upstream_backward(pc)), ("wide", wide_backward(pc)))
