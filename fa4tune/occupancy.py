"""Theoretical occupancy on a target from a kernel's registers, threads and shared memory."""

from __future__ import annotations

from dataclasses import dataclass

from fa4tune.targets import Target


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks and warps per SM, and which resource limits them."""

    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # resident warps / max warps per SM
    limiter: str


def occupancy(target: Target, num_threads: int, registers: int, smem_bytes: int) -> Occupancy:
    """Blocks per SM limited by threads, registers (per-warp allocation units) and shared memory."""
    warps = -(-num_threads // 32)
    regs_per_warp = -(-(registers * 32) // target.register_alloc_unit) * target.register_alloc_unit
    limits = {
        "threads": target.max_threads_per_sm // (warps * 32),
        "blocks": target.max_blocks_per_sm,
        "registers": (target.registers_per_sm // regs_per_warp) // warps if regs_per_warp else target.max_blocks_per_sm,
        "smem": target.smem_per_sm // (smem_bytes + target.smem_reserved_per_block),
    }
    limiter = min(limits, key=lambda k: limits[k])
    blocks = max(0, limits[limiter])
    max_warps = target.max_threads_per_sm // 32
    return Occupancy(blocks, blocks * warps, blocks * warps / max_warps, limiter)
