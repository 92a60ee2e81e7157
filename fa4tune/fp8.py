"""FP8 (e4m3) inputs for attention, as the SM120 FP8 forward takes them (issue 45): Q and K quantized per tile of
rows with one fp32 scale each (amax / 448), K smoothed first (SageAttention's mean subtraction: arXiv 2410.02367).

Smoothing subtracts each (batch, head, channel)'s mean over the keys from K. Every score of a query row moves by the
same q . mean, so softmax and the output do not change; the LSE moves by softmax_scale * q . mean, which
`lse_correction` gives back (from the unquantized q). It keeps a channel that carries a large offset over all keys
from setting its tiles' scales: on such inputs per-tile e4m3 without it misses the FP8 gate by 2x
(docs/measurements/2026-12-06-fp8-accuracy-gate.md).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite e4m3 value


def quantize_per_tile(x: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (batch, seqlen, heads, dim) -> (e4m3 values of the same shape, fp32 scales (batch, heads, tiles)):
    x ~= values * scale[b, h, row // tile], each tile of `tile` rows of one head scaled by amax / 448 (1 if all 0)."""
    b, s, h, d = x.shape
    tiles = -(-s // tile)
    padded = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, tiles * tile - s)).view(b, tiles, tile, h, d)
    amax = padded.abs().amax(dim=(2, 4))  # (b, tiles, h)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (padded / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.view(b, tiles * tile, h, d)[:, :s].contiguous(), scale.permute(0, 2, 1).contiguous()


def dequantize_per_tile(values: torch.Tensor, scale: torch.Tensor, tile: int) -> torch.Tensor:
    """quantize_per_tile's inverse, in fp32."""
    rows = scale.permute(0, 2, 1).repeat_interleave(tile, dim=1)[:, : values.shape[1]]  # (b, s, h)
    return values.float() * rows[..., None]


def smooth_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K minus its mean over the keys, in fp32; the mean (batch, heads, dim), fp32) for (batch, seqlen, heads, dim)."""
    mean = k.float().mean(dim=1)
    return k.float() - mean[:, None], mean


def lse_correction(q: torch.Tensor, mean: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """What smoothing K took off each row's LSE, (batch, heads, seqlen) fp32: softmax_scale * q . mean, GQA by
    repeating the K heads' means."""
    group = q.shape[2] // mean.shape[1]
    return torch.einsum("bshd,bhd->bhs", q.float(), mean.repeat_interleave(group, dim=1)) * softmax_scale
