"""FLOPs of an attention call, as upstream counts them (flash_attn/cute/bench_utils.py `flops`).

Forward: two matrix products per (query, key) pair that is not masked, `2 * sq * avg_sk * (d + dv)` per head;
causal masking is bottom-right aligned, so a query row sees `sk - sq + row + 1` keys and the average is
`(max(0, sk - sq) + sk) / 2` (upstream's formula, which also holds when sq != sk). A sliding window counts the keys
each row sees, as upstream's bench_utils does for a non-causal window: row i sees [i + sk - sq - left, i + sk - sq +
right] within the keys, a row seeing none counting 0. Under causal the right side is 0 (upstream's kernels mask so);
upstream's bench_utils counts a causal call with a window as plain causal, which would credit Mistral's 4096-key window
at 8K tokens with 1.3x the work it does, so the window counts there too.
Backward is 2.5x forward (five products instead of two).
"""

from __future__ import annotations

from fa4tune.config import NO_WINDOW, Problem, is_local

BACKWARD_FACTOR = 2.5


def average_seqlen_k(seqlen_q: int, seqlen_k: int, causal: bool, window_size_left: int = NO_WINDOW,
                     window_size_right: int = NO_WINDOW) -> float:
    """Keys a query row attends to, on average (upstream's causal average; a sliding window's per-row count)."""
    if is_local(causal, window_size_left, window_size_right):
        right = 0 if causal else window_size_right
        offset = seqlen_k - seqlen_q
        total = 0
        for row in range(seqlen_q):
            first = max(row + offset - window_size_left, 0) if window_size_left >= 0 else 0
            last = min(row + offset + right, seqlen_k - 1) if right >= 0 else seqlen_k - 1
            total += max(0, last - first + 1)
        return total / seqlen_q
    if causal:
        return (max(0, seqlen_k - seqlen_q) + seqlen_k) / 2
    return float(seqlen_k)


def forward_flops(batch: int, num_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, head_dim_v: int, causal: bool,
                  window_size_left: int = NO_WINDOW, window_size_right: int = NO_WINDOW) -> float:
    """Forward FLOPs: b * h * 2 * sq * avg_sk * (d + dv), h = query heads."""
    average = average_seqlen_k(seqlen_q, seqlen_k, causal, window_size_left, window_size_right)
    return batch * num_heads * 2 * seqlen_q * average * (head_dim + head_dim_v)


def backward_flops(batch: int, num_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, head_dim_v: int, causal: bool,
                   window_size_left: int = NO_WINDOW, window_size_right: int = NO_WINDOW) -> float:
    """Backward FLOPs: 2.5x the forward's."""
    return BACKWARD_FACTOR * forward_flops(batch, num_heads, seqlen_q, seqlen_k, head_dim, head_dim_v, causal,
                                           window_size_left, window_size_right)


def problem_flops(problem: Problem, direction: str) -> float:
    """FLOPs of one problem in one direction ("fwd" or "bwd"); a packed problem's, its sequences' sum."""
    count = backward_flops if direction == "bwd" else forward_flops
    window = (problem.window_size_left, problem.window_size_right)
    if problem.lengths:
        return sum(count(1, problem.num_heads, n, n, problem.head_dim, problem.head_dim_v, problem.causal, *window)
                   for n in problem.lengths)
    return count(
        problem.batch, problem.num_heads, problem.seqlen_q, problem.seqlen_k,
        problem.head_dim, problem.head_dim_v, problem.causal, *window,
    )


def tflops(flops: float, milliseconds: float) -> float:
    """Rate in TFLOPS (10^12 FLOPs per second) for a call that took `milliseconds`."""
    return flops / (milliseconds * 1e-3) / 1e12
