"""The physical floor of a timed call: it reads its inputs and writes its outputs at least once, so it takes at least
their bytes over the device's memory bandwidth (the L2 is flushed before every timed call). A time below it is a
clock that stopped or work that was not done, never a fast kernel: refused as `below_memory_floor` (issue 66).
Forward: q, k, v read, out and LSE written. Backward: q, k, v, out, dout and LSE read, dq, dk, dv written. Under a
sliding window only the keys some query row sees need reading (a decode over a long cache reads its window).
"""

from __future__ import annotations

from fa4tune.config import Problem, is_local
from fa4tune.harness.gate import TORCH_DTYPES


def traffic_bytes(problem: Problem, direction: str) -> int:
    """Bytes a call must move between memory and the chip at least once."""
    rows_q = sum(problem.lengths) if problem.lengths else problem.batch * problem.seqlen_q
    rows_k = sum(problem.lengths) if problem.lengths else problem.batch * problem.seqlen_k
    if is_local(problem.causal, problem.window_size_left, problem.window_size_right):
        rows_k = sum(keys_seen(n, n, problem) for n in problem.lengths) if problem.lengths else (
            problem.batch * keys_seen(problem.seqlen_q, problem.seqlen_k, problem))
    q = rows_q * problem.num_heads * problem.head_dim
    k = rows_k * problem.num_heads_kv * problem.head_dim
    v = rows_k * problem.num_heads_kv * problem.head_dim_v
    out = rows_q * problem.num_heads * problem.head_dim_v
    lse_bytes = rows_q * problem.num_heads * 4
    size = TORCH_DTYPES[problem.dtype].itemsize
    if direction == "fwd":
        return (q + k + v + out) * size + lse_bytes
    return 2 * (q + k + v) * size + 2 * out * size + lse_bytes  # read q, k, v, out, dout, LSE; write dq, dk, dv


def keys_seen(seqlen_q: int, seqlen_k: int, problem: Problem) -> int:
    """Keys of one sequence that some query row sees under the problem's window (bottom-right aligned: the first row's
    first key to the last row's last key; causal caps the right side at 0)."""
    left, right = problem.window_size_left, 0 if problem.causal else problem.window_size_right
    first = max(seqlen_k - seqlen_q - left, 0) if left >= 0 else 0
    last = min(seqlen_k - 1 + right, seqlen_k - 1) if right >= 0 else seqlen_k - 1
    return max(0, last - first + 1)


def floor_ms(problem: Problem, direction: str, bytes_per_second: float) -> float:
    """Milliseconds a call cannot beat at this bandwidth."""
    return traffic_bytes(problem, direction) / bytes_per_second * 1e3


def below_floor(problem: Problem, direction: str, fastest_ms: float, bytes_per_second: float | None) -> str:
    """'' when `fastest_ms` is possible (or no bandwidth is known: the CPU), else why not, with the numbers."""
    if bytes_per_second is None:
        return ""
    floor = floor_ms(problem, direction, bytes_per_second)
    if fastest_ms >= floor:
        return ""
    return (f"its fastest timed call took {fastest_ms:.4g} ms, below the {floor:.4g} ms it takes to move its "
            f"{traffic_bytes(problem, direction)} B once at {bytes_per_second / 1e9:.0f} GB/s")
