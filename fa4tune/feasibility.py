"""Static feasibility: is a config possible for a target and problem class, and if not, which rule fails.

Pure functions, no GPU, no compiler. The rules are upstream's `can_implement` (SM120 shared-memory
formula included) plus the ones upstream does not check but the kernels need; each rejection names
its rule and the numbers. `upstream_can_implement_*` call upstream's own functions, so tests can show
that both agree wherever upstream has a rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.targets import Target

FORWARD_KERNELS = ("sm120", "sm120_tma")
BYTES_PER_ELEMENT = 2  # fp16 / bf16
MBARRIER_BYTES = 8
# The TMA kernel's shared storage: tiles aligned to 1024 B (the 128-byte TMA swizzle repeats every
# 1024 B), mbarriers after them, and the struct's size rounded up to its 1024-byte alignment.
TMA_SMEM_ALIGN = 1024
TMA_NUM_STAGES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Verdict:
    """The answer of a feasibility check: ok, or the failing rule with a message that has the numbers."""

    ok: bool
    rule: str = ""
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "ok" if self.ok else f"{self.rule}: {self.message}"


OK = Verdict(True)


def _fail(rule: str, message: str) -> Verdict:
    return Verdict(False, rule, message)


def forward_smem_bytes(cfg: ForwardConfig, pc: ProblemClass) -> tuple[int, str]:
    """Shared memory the config's forward kernel needs and a breakdown (upstream's formula for "sm120")."""
    if cfg.kernel == "sm120_tma":
        return tma_forward_smem_bytes(cfg, pc)
    q = cfg.tile_m * pc.head_dim * BYTES_PER_ELEMENT
    k = cfg.tile_n * pc.head_dim * cfg.num_stages * BYTES_PER_ELEMENT
    v = cfg.tile_n * pc.head_dim_v * cfg.num_stages * BYTES_PER_ELEMENT
    if cfg.Q_in_regs:
        return max(q, v) + k, f"max(Q {q}, V {v}) + K {k} (Q_in_regs shares Q and V)"
    return q + k + v, f"Q {q} + K {k} + V {v}"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def tma_forward_smem_bytes(cfg: ForwardConfig, pc: ProblemClass) -> tuple[int, str]:
    """Shared memory of the TMA forward kernel (experiment.TmaForwardSm120) and a breakdown.

    Tiles as upstream's formula (head dims padded to 16, each tile 1024-B aligned), plus one 8-byte
    mbarrier for Q and one per K stage and per V stage, the whole rounded up to 1024 B; this is the
    compiled kernel's `SharedStorage.size_in_bytes()` (tests/test_tma_kernel.py checks that).
    """
    hd, hdv = _round_up(pc.head_dim, 16), _round_up(pc.head_dim_v, 16)
    q = _round_up(cfg.tile_m * hd * BYTES_PER_ELEMENT, TMA_SMEM_ALIGN)
    k = _round_up(cfg.tile_n * hd * cfg.num_stages * BYTES_PER_ELEMENT, TMA_SMEM_ALIGN)
    v = _round_up(cfg.tile_n * hdv * cfg.num_stages * BYTES_PER_ELEMENT, TMA_SMEM_ALIGN)
    barriers = (1 + 2 * cfg.num_stages) * MBARRIER_BYTES
    if cfg.Q_in_regs:
        tiles, shared = max(q, v) + k, f"max(Q {q}, V {v}) + K {k} (Q_in_regs shares Q and V)"
    else:
        tiles, shared = q + k + v, f"Q {q} + K {k} + V {v}"
    total = _round_up(tiles + barriers, TMA_SMEM_ALIGN)
    return total, f"{shared} + {barriers} B of mbarriers, padded to {TMA_SMEM_ALIGN} B alignment"


def backward_smem_bytes(cfg: BackwardConfig, pc: ProblemClass) -> tuple[int, str]:
    """Shared memory the backward kernel's tiles need (upstream's formula) and a breakdown."""
    q = cfg.m_block_size * pc.head_dim * cfg.num_stages_Q * BYTES_PER_ELEMENT
    do = cfg.m_block_size * pc.head_dim_v * cfg.num_stages_dO * BYTES_PER_ELEMENT
    k = cfg.n_block_size * pc.head_dim * BYTES_PER_ELEMENT
    v = cfg.n_block_size * pc.head_dim_v * BYTES_PER_ELEMENT
    if cfg.V_in_regs:
        return max(q, v) + do + k, f"max(Q {q}, V {v}) + dO {do} + K {k} (V_in_regs shares Q and V)"
    return q + v + do + k, f"Q {q} + V {v} + dO {do} + K {k}"


def _positive_multiple(name: str, value: int, multiple: int, upper: int) -> Verdict:
    if value <= 0 or value % multiple or value > upper:
        return _fail(f"{name}_domain", f"{name} must be a multiple of {multiple} in [{multiple}, {upper}], got {value}")
    return OK


def _sizes(cfg, m_name: str, n_name: str) -> Verdict:
    """Both tile sizes positive multiples of 16 (at most 256), num_threads of 32 (at most 512); upstream's own
    rule names where it has the rule (tile_n / n_block_size multiple of 16, num_threads multiple of 32)."""
    for name, multiple, upper in ((m_name, 16, 256), (n_name, 16, 256), ("num_threads", 32, 512)):
        value = getattr(cfg, name)
        verdict = _positive_multiple(name, value, multiple, upper)
        if not verdict:
            if name == n_name and value % 16:
                return _fail(f"{n_name}_multiple_of_16", f"{n_name} must be a multiple of 16, got {value}")
            if name == "num_threads" and value % 32:
                return _fail("num_threads_multiple_of_32", f"num_threads must be a multiple of 32 (a warp), got {value}")
            return verdict
    return OK


def check_forward(cfg: ForwardConfig, pc: ProblemClass, target: Target) -> Verdict:
    """All static rules for a forward config, in the order a reader would check them."""
    if cfg.kernel not in FORWARD_KERNELS:
        return _fail("kernel_known", f"kernel {cfg.kernel!r} is not one of {', '.join(FORWARD_KERNELS)}")
    if not (verdict := _sizes(cfg, "tile_m", "tile_n")):
        return verdict
    if cfg.kernel == "sm120_tma":
        # checked before the shared-memory formula, which needs a stage count
        if isinstance(cfg.num_stages, bool) or cfg.num_stages not in TMA_NUM_STAGES:
            return _fail(
                "tma_num_stages",
                f"the TMA kernel needs num_stages (the depth of its K/V mbarrier pipeline) in "
                f"{TMA_NUM_STAGES[0]}..{TMA_NUM_STAGES[-1]}, got {cfg.num_stages!r}",
            )
    elif cfg.num_stages not in (1, 2, 3, 4):
        return _fail("num_stages_domain", f"num_stages must be 1..4 (cp.async K/V pipeline depth), got {cfg.num_stages}")
    smem, breakdown = forward_smem_bytes(cfg, pc)
    if smem > target.smem_per_block:
        return _fail(
            "tma_smem_capacity" if cfg.kernel == "sm120_tma" else "smem_capacity",
            f"needs {smem} B of shared memory ({breakdown}), {target.name} has {target.smem_per_block} B per block",
        )
    if (cfg.tile_m * 2) % cfg.num_threads:
        # upstream's rule; it is the MMA layout's: num_threads/32 warps of 16 rows each must tile tile_m
        return _fail(
            "tile_m_x2_divisible_by_num_threads",
            f"tile_m*2 = {cfg.tile_m * 2} is not a multiple of num_threads={cfg.num_threads} "
            f"({cfg.num_threads // 32} MMA warps of 16 rows need tile_m to be a multiple of {cfg.num_threads // 2})",
        )
    if cfg.Q_in_regs and cfg.num_stages > 1:
        # Measured: Q_in_regs with 2 stages compiles but gives wrong outputs (max error 3.7 vs a tolerance
        # of 0.016, every problem class; docs/measurements/2026-11-29-h200-smoke.md). Upstream PR #2499 also
        # pairs Q_in_regs with one stage only.
        return _fail("Q_in_regs_one_stage", f"Q_in_regs needs num_stages=1 (Q shares its buffer with V), got num_stages={cfg.num_stages}")
    if pc.qhead_per_kvhead > 1 and cfg.tile_m & (cfg.tile_m - 1):
        # Found by compiling: PackGQA's layouts assert for tile_m=192 (qhead_per_kvhead 2 and 4).
        return _fail(
            "pack_gqa_tile_m_power_of_two",
            f"with GQA packing (qhead_per_kvhead={pc.qhead_per_kvhead}) tile_m must be a power of two, got {cfg.tile_m}",
        )
    if pc.qhead_per_kvhead > 1 and cfg.tile_m > cfg.num_threads:
        # Measured on the H200 sweep (docs/measurements/2026-11-29-h200-fwd-sweep.md): with GQA packing every
        # tile_m=256 config with 128 threads failed PackGQA's assertion at compile time; all others compiled.
        return _fail(
            "pack_gqa_tile_m_le_num_threads",
            f"with GQA packing (qhead_per_kvhead={pc.qhead_per_kvhead}) tile_m ({cfg.tile_m}) must not exceed num_threads ({cfg.num_threads})",
        )
    return OK


def check_backward(cfg: BackwardConfig, pc: ProblemClass, target: Target) -> Verdict:
    """All static rules for a backward config."""
    if not (verdict := _sizes(cfg, "m_block_size", "n_block_size")):
        return verdict
    for name in ("num_stages_Q", "num_stages_dO"):
        if getattr(cfg, name) not in (1, 2):
            return _fail(f"{name}_domain", f"{name} must be 1 or 2, got {getattr(cfg, name)}")
    smem, breakdown = backward_smem_bytes(cfg, pc)
    if smem > target.smem_per_block:
        return _fail(
            "smem_capacity",
            f"needs {smem} B of shared memory ({breakdown}), {target.name} has {target.smem_per_block} B per block",
        )
    if cfg.num_stages_Q < cfg.num_stages_dO:
        return _fail("num_stages_Q_ge_dO", f"num_stages_Q ({cfg.num_stages_Q}) must be >= num_stages_dO ({cfg.num_stages_dO})")
    if pc.causal and cfg.m_block_size != cfg.n_block_size:
        # Measured: causal backward with 128x64 or 64x128 blocks gives wrong dQ/dK/dV (relative error > 1.5,
        # d64 and d128, GQA too; docs/measurements/2026-11-29-h200-smoke.md); non-causal is correct.
        return _fail(
            "causal_bwd_square_blocks",
            f"causal backward needs m_block_size == n_block_size, got {cfg.m_block_size}x{cfg.n_block_size}",
        )
    warps = cfg.num_threads // 32
    for name in ("AtomLayoutMSdP", "AtomLayoutNdKV", "AtomLayoutMdQ"):
        value = getattr(cfg, name)
        if value <= 0 or warps % value:
            return _fail(f"{name}_divides_warps", f"{name}={value} must divide the {warps} MMA warps of num_threads={cfg.num_threads}")
    return OK


def upstream_can_implement_forward(cfg: ForwardConfig, pc: ProblemClass, is_causal: bool | None = None) -> bool:
    """Upstream's FlashAttentionForwardSm120.can_implement for the same numbers (tests compare)."""
    import cutlass
    from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120

    dtype = cutlass.BFloat16 if pc.dtype == "bf16" else cutlass.Float16
    return FlashAttentionForwardSm120.can_implement(
        dtype, pc.head_dim, pc.head_dim_v, cfg.tile_m, cfg.tile_n, cfg.num_stages, cfg.num_threads,
        pc.causal if is_causal is None else is_causal, Q_in_regs=cfg.Q_in_regs,
    )


def upstream_can_implement_backward(cfg: BackwardConfig, pc: ProblemClass) -> bool:
    """Upstream's FlashAttentionBackwardSm120.can_implement for the same numbers (tests compare)."""
    import cutlass
    from flash_attn.cute.flash_bwd_sm120 import FlashAttentionBackwardSm120

    dtype = cutlass.BFloat16 if pc.dtype == "bf16" else cutlass.Float16
    return FlashAttentionBackwardSm120.can_implement(
        dtype, pc.head_dim, pc.head_dim_v, cfg.m_block_size, cfg.n_block_size, cfg.num_stages_Q,
        cfg.num_stages_dO, cfg.num_threads, pc.causal, V_in_regs=cfg.V_in_regs,
    )
