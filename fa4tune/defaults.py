"""Upstream's current SM120 settings (flash-attn-4 4.0.0b36 interface.py), as our configs.

The baseline every tuned config is compared with, and the seed of experiment.py's dispatch tables.
"""

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass


def upstream_forward(pc: ProblemClass) -> ForwardConfig:
    """`_get_fwd_config` for SM120: 128x128 for head_dim <= 64, else 128x64; 128 threads, 1 stage."""
    tile_n = 128 if pc.head_dim <= 64 else 64
    return ForwardConfig(tile_m=128, tile_n=tile_n, num_threads=128, num_stages=1, Q_in_regs=False)


def upstream_backward(pc: ProblemClass) -> BackwardConfig:
    """`_flash_attn_bwd` for SM120: 64x64 blocks, 2 stages if head_dim <= 64 else 1, atom layouts 4."""
    stages = 2 if pc.head_dim <= 64 else 1
    return BackwardConfig(
        m_block_size=64, n_block_size=64, num_stages_Q=stages, num_stages_dO=stages, num_threads=128,
        SdP_swapAB=False, dKV_swapAB=False, dQ_swapAB=False,
        AtomLayoutMSdP=4, AtomLayoutNdKV=4, AtomLayoutMdQ=4, V_in_regs=False,
    )
