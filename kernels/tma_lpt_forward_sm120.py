"""The TMA-fed SM120 forward with its tiles handed out longest first (kernel "sm120_tma_lpt"): TmaForwardSm120's code,
the CTA with block index L running the tile that the longest-processing-time-first order puts at L.

Why: upstream's SM80 path (and so TmaForwardSm120) runs m block `blockIdx.x`, and the GPU launches CTAs in block-index
order, x fastest: in a causal problem, bottom-right aligned, a higher m block has more keys, so every head's longest
tiles start last and end the kernel alone (the tail), and in a grid of one wave the longest tiles share SMs with each
other. Upstream's SM90 and SM100 paths order causal tiles longest first (their LPT tile scheduler). Here the CTA of
linear block index L = x + X (y + Y z) runs m block X - 1 - L // (Y Z), head (L % (Y Z)) % Y, batch (L % (Y Z)) // Y:
every head's m block X-1 first, then X-2, and so on. It is a permutation of the same tiles, so the kernel computes
the same outputs; only the schedule differs. In a non-causal problem every tile is as long as the others, and the
order changes nothing but which tiles share an SM.

Measured (docs/measurements/2026-12-04-h200-tma-lpt.md, H200 with SM120 kernels emulated): gated on the causal rows of
the matrix, faster than its TMA twin on 13 of the 14 causal problems timed (0.4-12 %), level (0.999) on a 12K-token
prefill of many waves, where the tail is short anyway. So the search draws it like any class.
"""

from cutlass import Int32

import cutlass.cute as cute

from kernels.tma_forward_sm120 import TmaForwardSm120


def longest_first(linear, num_m_blocks, num_heads, num_batch):
    """The (m block, head, batch) that CTA number `linear` (x fastest) runs: m blocks from the last down, all heads and
    batches of one m block before the next. Plain integer arithmetic: the kernel calls it with its Int32 indices, the
    tests with Python ints."""
    per_m_block = num_heads * num_batch
    rest = linear % per_m_block
    return num_m_blocks - 1 - linear // per_m_block, rest % num_heads, rest // num_heads


class TmaLptForwardSm120(TmaForwardSm120):
    """TmaForwardSm120 with the m blocks handed out longest first (highest m block first, all heads of it together)."""

    name = "sm120_tma_lpt"
    features = frozenset({"learnable_sink", "local", "softcap"})  # the base kernel's (sink, window, soft-cap): only the tile order differs

    def order_tile(self, m_block: Int32, head: Int32, batch: Int32, seqlen_k: Int32):
        num_m_blocks, num_heads, num_batch = cute.arch.grid_dim()
        return longest_first(m_block + num_m_blocks * (head + num_heads * batch), num_m_blocks, num_heads, num_batch)
