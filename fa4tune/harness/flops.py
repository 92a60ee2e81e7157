"""FLOPs of an attention call, as upstream counts them (flash_attn/cute/bench_utils.py `flops`).

Forward: two matrix products per (query, key) pair that is not masked, `2 * sq * avg_sk * (d + dv)` per head;
causal masking is bottom-right aligned, so a query row sees `sk - sq + row + 1` keys and the average is
`(max(0, sk - sq) + sk) / 2` (upstream's formula, which also holds when sq != sk). Backward is 2.5x forward
(five products instead of two).
"""

from __future__ import annotations

from fa4tune.config import Problem

BACKWARD_FACTOR = 2.5


def average_seqlen_k(seqlen_q: int, seqlen_k: int, causal: bool) -> float:
    """Keys a query row attends to, on average (upstream's causal average)."""
    if causal:
        return (max(0, seqlen_k - seqlen_q) + seqlen_k) / 2
    return float(seqlen_k)


def forward_flops(batch: int, num_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, head_dim_v: int, causal: bool) -> float:
    """Forward FLOPs: b * h * 2 * sq * avg_sk * (d + dv), h = query heads."""
    return batch * num_heads * 2 * seqlen_q * average_seqlen_k(seqlen_q, seqlen_k, causal) * (head_dim + head_dim_v)


def backward_flops(batch: int, num_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, head_dim_v: int, causal: bool) -> float:
    """Backward FLOPs: 2.5x the forward's."""
    return BACKWARD_FACTOR * forward_flops(batch, num_heads, seqlen_q, seqlen_k, head_dim, head_dim_v, causal)


def problem_flops(problem: Problem, direction: str) -> float:
    """FLOPs of one problem in one direction ("fwd" or "bwd"); a packed problem's, its sequences' sum."""
    count = backward_flops if direction == "bwd" else forward_flops
    if problem.lengths:
        return sum(count(1, problem.num_heads, n, n, problem.head_dim, problem.head_dim_v, problem.causal) for n in problem.lengths)
    return count(
        problem.batch, problem.num_heads, problem.seqlen_q, problem.seqlen_k,
        problem.head_dim, problem.head_dim_v, problem.causal,
    )


def tflops(flops: float, milliseconds: float) -> float:
    """Rate in TFLOPS (10^12 FLOPs per second) for a call that took `milliseconds`."""
    return flops / (milliseconds * 1e-3) / 1e12
