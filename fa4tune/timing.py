"""Timing GPU calls honestly: warm-up, L2 flushed before each timed call, input sets rotated,
candidates interleaved in a shuffled order over rounds, and a median with its spread.

Events are recorded around every call and read after one synchronize per round (as
`triton.testing.do_bench` does), so the host runs ahead and its launch overhead hides behind
device work wherever the device is the bottleneck. The timer is an object with `time_calls`,
so tests run the same schedule on the CPU with a wall-clock timer.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

MIN_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    """Milliseconds of one candidate's timed calls: the samples and their summary."""

    samples_ms: tuple[float, ...]
    stopped: bool = False  # timed no further: its median passed its give-up threshold (benchmark's give_up)

    def __post_init__(self):
        if not self.samples_ms:
            raise ValueError("a Timing needs at least one sample")

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    @property
    def q1_ms(self) -> float:
        return _quantile(self.samples_ms, 0.25)

    @property
    def q3_ms(self) -> float:
        return _quantile(self.samples_ms, 0.75)

    @property
    def iqr_ms(self) -> float:
        """Interquartile range: the spread of the middle half of the samples."""
        return self.q3_ms - self.q1_ms

    def summary(self) -> dict:
        """Median, min, max, quartiles and sample count (JSON-ready)."""
        return {
            "median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms,
            "q1_ms": self.q1_ms, "q3_ms": self.q3_ms, "samples": len(self.samples_ms),
        }


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def l2_flush_bytes(l2_cache_bytes: int | None) -> int:
    """Bytes to write between timed calls: at least twice the L2, at least 256 MB."""
    return max(MIN_FLUSH_BYTES, 2 * (l2_cache_bytes or 0))


class L2Flusher:
    """Writes a buffer larger than the L2, so the next call starts from a cold cache."""

    def __init__(self, nbytes: int, device="cuda"):
        import torch

        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class CudaEventTimer:
    """Device time of each call from a pair of CUDA events; one synchronize per batch of calls."""

    def time_calls(self, calls: Sequence[Callable[[], object]], flush: Callable[[], None] | None = None) -> list[float]:
        """Milliseconds of each call, in order (the flush before each call is outside its events)."""
        import torch

        pairs = []
        for fn in calls:
            if flush is not None:
                flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in pairs]


class WallClockTimer:
    """Host time of each call (for CPU tensors, where CUDA events do not exist)."""

    def time_calls(self, calls: Sequence[Callable[[], object]], flush: Callable[[], None] | None = None) -> list[float]:
        """Milliseconds of each call, in order."""
        samples = []
        for fn in calls:
            if flush is not None:
                flush()
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples


def schedule(names: Sequence[str], num_input_sets: int, rounds: int, seed: int) -> list[list[tuple[str, int]]]:
    """Per round, the (candidate, input set) calls: candidates in a fresh shuffled order each round,
    each going through every input set, starting at a set that rotates with the round."""
    rng = random.Random(seed)
    plan = []
    for r in range(rounds):
        order = list(names)
        rng.shuffle(order)
        plan.append([(name, (r + i) % num_input_sets) for name in order for i in range(num_input_sets)])
    return plan


def benchmark(
    candidates: Mapping[str, Sequence[Callable[[], object]]],
    *,
    timer,
    flush: Callable[[], None] | None = None,
    warmup: int = 3,
    rounds: int = 10,
    seed: int = 0,
    give_up: Mapping[str, float] | None = None,
) -> dict[str, Timing]:
    """Time candidates against each other; `candidates[name][i]` runs the call on input set i.

    Warm-up calls (compiles, allocations, autotuning caches) run first and are not timed; each candidate
    runs on every input set at least once during warm-up. After each round, a candidate whose median so far
    exceeds its `give_up[name]` milliseconds is timed no further (its Timing has `stopped`): a config many
    times slower than the incumbent costs one round, not all of them.
    """
    if not candidates:
        return {}
    num_sets = {len(calls) for calls in candidates.values()}
    if len(num_sets) != 1 or 0 in num_sets:
        raise ValueError("every candidate needs the same, non-zero number of input sets")
    num_sets = num_sets.pop()
    for calls in candidates.values():
        for i in range(max(warmup, num_sets)):
            calls[i % num_sets]()
    give_up = give_up or {}
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    stopped: set[str] = set()
    plans = schedule(list(candidates), num_sets, rounds, seed)
    for r, plan in enumerate(plans):
        plan = [(name, i) for name, i in plan if name not in stopped]
        if not plan:
            break
        times = timer.time_calls([candidates[name][i] for name, i in plan], flush)
        for (name, _), ms in zip(plan, times):
            samples[name].append(ms)
        if r + 1 < len(plans):  # a candidate timed to the end keeps its full record
            stopped |= {name for name, limit in give_up.items() if name in samples and statistics.median(samples[name]) > limit}
    return {name: Timing(tuple(values), stopped=name in stopped) for name, values in samples.items()}


def is_improvement(candidate_runs: Sequence[Timing], incumbent_runs: Sequence[Timing] | Timing) -> bool:
    """Keep-worthy: at least two separate candidate runs, each faster than the incumbent's median by more
    than the measured spread (the larger of either run's IQR and the incumbent's run-to-run spread)."""
    incumbents = [incumbent_runs] if isinstance(incumbent_runs, Timing) else list(incumbent_runs)
    candidate_runs = list(candidate_runs)
    if len(candidate_runs) < 2 or not incumbents:
        return False
    incumbent_median = statistics.median(t.median_ms for t in incumbents)
    medians = [t.median_ms for t in incumbents]
    incumbent_spread = max(max(t.iqr_ms for t in incumbents), max(medians) - min(medians))
    return all(incumbent_median - run.median_ms > max(run.iqr_ms, incumbent_spread) for run in candidate_runs)
