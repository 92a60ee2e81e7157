"""Upstream's SM120 forward as a kernel class (kernel "sm120"): upstream's code, every knob from the config.

Its shared-memory formula is upstream's `can_implement` one, as the compiled struct has it (head dims padded to
16, each tile aligned to 1024 B; the same bytes as upstream's formula wherever its tiles are whole KBs, as on every
suite's class); its rules are the ones upstream's SM80 code needs beyond that. A learnable sink is folded into each
finished row (kernels/learnable_sink_sm120.py).
"""

from flash_attn.cute.flash_fwd_sm120 import FlashAttentionForwardSm120

from fa4tune.feasibility import OK, Verdict
from fa4tune.kernel_class import ForwardKernel, Limits
from kernels.learnable_sink_sm120 import LearnableSinkFold

BYTES_PER_ELEMENT = 2  # fp16 / bf16
TILE_ALIGN = 1024  # upstream's SharedStorage aligns every tile to 1024 B (cute.struct.Align[..., 1024])
HEAD_DIM_MULTIPLE = 16  # upstream pads head_dim (tile_hdim) to a multiple of 16


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value."""
    return -(-value // multiple) * multiple


def tile_bytes(rows: int, head_dim: int, stages: int = 1) -> int:
    """Bytes of a (rows, head_dim, stages) tile in upstream's shared storage."""
    return round_up(rows * round_up(head_dim, HEAD_DIM_MULTIPLE) * stages * BYTES_PER_ELEMENT, TILE_ALIGN)


class TunedForwardSm120(LearnableSinkFold, ForwardKernel, FlashAttentionForwardSm120):
    """Upstream's SM120 forward (SM80 mma.sync, cp.async K/V pipeline), all knobs from the config."""

    name = "sm120"
    upstream = FlashAttentionForwardSm120
    varlen = True  # upstream's SM80 code reads cu_seqlens (SeqlenInfo, the varlen tile scheduler)
    # upstream's SM80 code: a sliding window (BlockInfo, AttentionMask's mask_local), the soft-cap (the host's score_mod)
    # and per-sequence lengths (SeqlenInfo's seqused_q / seqused_k), as upstream's SM120 path runs them; a learnable
    # sink folded into each finished row (fold_learnable_sink)
    features = frozenset({"local", "softcap", "seqused", "seqused_q", "learnable_sink"})
    limits = Limits(num_stages=(1, 2, 3, 4))

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
