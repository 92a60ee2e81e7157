"""The paired longest-first TMA forward whose warps skip the PV work on keys they cannot see (kernel
"sm120_tma_trimmed").

Why: a masked KV block (a row block's last one, past seqlen_k, and the causal diagonal's) is computed whole by
upstream's code and then masked. At the issue's GQA chunked prefill (sq 512 over sk 8K, 64x96 tiles, GQA 4 packed)
each 64-row tile's last block holds 0-80 key columns past its diagonal (96 does not divide the keys a tile sees), and
each warp of 16 packed rows sees fewer still. Here each warp stops its PV gemm (its MMAs and its ldmatrix reads of V,
the reads being the kernel's bound: docs/measurements/2026-12-04-h200-ncu-gqa-chunked.md) after the last 16-key step
that one of its rows may see (`TmaForwardSm120.trim_masked`); its probabilities past that are zeros, so the sum is
the same. The unmasked blocks run upstream's code unchanged. Trimming the QK gemm the same way, as well or alone, was
slower than trimming PV alone on every problem measured (alone: 9 % slower than untrimmed at d64), so it is not done.
"""

from kernels.tma_paired_forward_sm120 import TmaPairedForwardSm120


class TmaTrimmedForwardSm120(TmaPairedForwardSm120):
    """TmaPairedForwardSm120 with the masked blocks' PV gemms trimmed to each warp's visible keys."""

    name = "sm120_tma_trimmed"
    features = frozenset({"learnable_sink", "local", "softcap"})  # the base kernel's: trimming skips masked PV work only (by seqlen_k under a window)
    trim_masked = True
