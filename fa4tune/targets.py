"""Targets as data: the GPU a config must fit (the 99 KB rule is the target's, wherever we run).

Per-SM limits for compute capability 12.0 are from the CUDA C++ Programming Guide, table
"Technical Specifications per Compute Capability" (12.0: 48 resident warps / 1536 threads per SM,
32 resident blocks per SM, 64K 32-bit registers per SM, 255 registers per thread, 100 KB shared
memory per SM of which 99 KB (101376 B) can be opted into by one block, 1 KB reserved per block).
The per-block figure is also what `cutlass.utils.get_smem_capacity_in_bytes("sm_120")` returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from fa4tune.config import ConfigError


@dataclass(frozen=True)
class Target:
    """One GPU architecture a config is checked against and compiled for."""

    name: str
    arch: str  # FLASH_ATTENTION_ARCH value
    cute_arch: str  # CUTE_DSL_ARCH value for compiles without the GPU
    num_sms: int
    smem_per_block: int  # opt-in maximum for one block, bytes
    smem_per_sm: int
    smem_reserved_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_thread: int
    register_alloc_unit: int  # registers are allocated per warp in units of this many
    peak_tflops_bf16: float  # dense bf16 mma.sync with fp32 accumulate, whole GPU
    peak_source: str
    description: str


SM120_SMEM_PER_BLOCK = 101376

_SM120 = dict(
    arch="sm_120",
    cute_arch="sm_120a",
    smem_per_block=SM120_SMEM_PER_BLOCK,
    smem_per_sm=102400,
    smem_reserved_per_block=1024,
    max_threads_per_sm=1536,
    max_blocks_per_sm=32,
    registers_per_sm=65536,
    max_registers_per_thread=255,
    register_alloc_unit=256,
)

TARGETS: dict[str, Target] = {
    "sm120": Target(
        name="sm120",
        num_sms=170,
        # RTX 5090 (GB202, 170 SMs): NVIDIA's Blackwell GeForce whitepaper lists 209.5 dense FP16/BF16
        # tensor TFLOPS with FP32 accumulate at the boost clock.
        peak_tflops_bf16=209.5,
        peak_source="RTX 5090 dense bf16 tensor peak with fp32 accumulate (NVIDIA RTX Blackwell whitepaper)",
        description="GeForce RTX 5090 (SM 12.0, 170 SMs, 99 KB shared memory per block)",
        **_SM120,
    ),
    "sm120-pro6000": Target(
        name="sm120-pro6000",
        num_sms=188,
        # 503.8 is the dense figure (1007.6 with sparsity): 188 SMs x 2617 MHz boost x 1024 dense bf16 FLOPs
        # per SM per clock, the full fp32-accumulate rate that GeForce cards (RTX 5090: 512) halve.
        peak_tflops_bf16=503.8,
        peak_source="RTX PRO 6000 Blackwell dense bf16 tensor peak with fp32 accumulate (NVIDIA RTX Blackwell whitepaper)",
        description="RTX PRO 6000 Blackwell (SM 12.0, 188 SMs, 99 KB shared memory per block)",
        **_SM120,
    ),
}

DEFAULT_TARGET = "sm120"


def get_target(name: str | None = None) -> Target:
    """The named target (default: $FA4TUNE_TARGET or 'sm120'); a one-line error for unknown names."""
    name = name or os.environ.get("FA4TUNE_TARGET") or DEFAULT_TARGET
    if name not in TARGETS:
        raise ConfigError("unknown_target", f"target {name!r} is not one of {', '.join(TARGETS)}")
    return TARGETS[name]


def with_sms(target: Target, num_sms: int) -> Target:
    """The same target rules with the SM count of the GPU actually present (for emulated runs)."""
    return replace(target, num_sms=num_sms)
