"""Timing GPU calls honestly: warm-up, L2 flushed before each timed call, input sets rotated,
candidates interleaved in a shuffled order over rounds, and a median with its spread.

Events are recorded around every call and read after one synchronize per round; each round is
queued behind a blocking kernel (CudaEventTimer), so no sample includes the host's launch time even
when a kernel is shorter than its launch. The timer is an object with `time_calls`, and its device
operations sit behind a small interface (TorchCudaDevice), so tests run the same schedule on the CPU
with a simulated device or a wall-clock timer.
"""

from __future__ import annotations

import random
import statistics
import threading
from dataclasses import asdict, dataclass
from os import urandom
from time import perf_counter
from typing import Callable, Mapping, Sequence

MIN_FLUSH_BYTES = 256 * 1024 * 1024
# The clock, the random draws and the thread count are bound here, at the harness's import (before experiment.py
# runs): a candidate that replaces time.perf_counter or os.urandom (reached as logging.time, say) changes neither
# (issue 66); runtime_guards checks at every trap and round that they are still what the harness bound.
_active_threads = threading.active_count


@dataclass(frozen=True)
class Timing:
    """Milliseconds of one candidate's timed calls: the samples and their summary."""

    samples_ms: tuple[float, ...]
    stopped: bool = False  # timed no further: its median passed its give-up threshold (benchmark's give_up)
    incorrect: str = ""  # why a timed call's output failed the check (benchmark's check), with the call's index
    checked_calls: int = 0  # timed calls whose outputs were checked

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


class TimingError(RuntimeError):
    """A round could not be timed on device time alone; the message names the rule and the numbers."""


class TorchCudaDevice:
    """The device operations CudaEventTimer needs, on torch.cuda's current device and stream."""

    CALIBRATION_CYCLES = 1_000_000  # about 0.5 ms at 2 GHz: long against the launch, short against the run
    _cycles_per_ms: dict[int, float] = {}  # per device index, measured once per process

    def block(self, ms: float) -> None:
        """Enqueue a kernel that keeps the device busy for about `ms` milliseconds (torch.cuda._sleep)."""
        import torch

        torch.cuda._sleep(max(1, int(ms * self.cycles_per_ms())))

    def cycles_per_ms(self) -> float:
        """Clock cycles _sleep spins per millisecond on this device (clock rates differ between GPUs)."""
        import torch

        index = torch.cuda.current_device()
        if index not in self._cycles_per_ms:
            rates = []
            for _ in range(3):
                start, end = self.event(), self.event()
                torch.cuda._sleep(self.CALIBRATION_CYCLES)  # queued first, so the timed sleep's launch is hidden
                start.record()
                torch.cuda._sleep(self.CALIBRATION_CYCLES)
                end.record()
                end.synchronize()
                rates.append(self.CALIBRATION_CYCLES / start.elapsed_time(end))
            self._cycles_per_ms[index] = statistics.median(rates)
        return self._cycles_per_ms[index]

    def event(self):
        """A timing event: record() on the current stream, query() True once the device passed it, elapsed_time(end) in ms."""
        import torch

        return torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        """Wait for all device work."""
        import torch

        torch.cuda.synchronize()

    def host_ms(self) -> float:
        """The host's clock, in milliseconds."""
        return perf_counter() * 1e3


@dataclass
class TimerStats:
    """What a CudaEventTimer did so far: rounds timed, rounds redone because the block ran out, time spent blocking."""

    rounds: int = 0  # rounds whose samples were returned
    rounds_redone: int = 0  # rounds discarded and run again: the device reached the timed calls before the host had enqueued them
    blocks: int = 0  # blocking kernels enqueued (one per try of a round; none when block=False)
    block_ms_total: float = 0.0  # device time asked of the blocking kernels
    last_block_ms: float = 0.0
    last_enqueue_ms: float = 0.0  # host time to enqueue the last round (flushes, events and calls)

    def to_dict(self) -> dict:
        return asdict(self)


class CudaEventTimer:
    """Device time of each call from a pair of CUDA events, every round queued behind a blocking kernel.

    A timed call costs the host more than many short kernels take to run (about 95 us per SM120 forward
    call), so a round that starts on an idle device runs each call as soon as the host launches it and
    its events measure the launch, not the kernel (a 60 us kernel measured 50-130 TFLOPS run to run).
    Here each round starts with a kernel that spins on the device (torch.cuda._sleep) for twice the
    host's enqueue time of the previous round; the host enqueues the flushes, events and calls behind
    it, and the device then runs them back to back. An event recorded right after the blocking kernel
    checks it: if it has completed by the time the host has enqueued the whole round, the device may
    have waited on the host, so the round is discarded and redone behind a longer block.

    A blocking kernel rather than CUDA graphs: it needs no cooperation from the candidate (graph capture
    fails for kernels that allocate, for autograd's backward and for host-side caches) and it keeps the
    L2 flush between timed calls. `block=False` is the old schedule (events read after one synchronize
    per round, no block), kept only to show the difference (bench/stability.py).
    """

    MIN_BLOCK_MS = 0.1
    INITIAL_HOST_MS_PER_CALL = 0.5  # before the first round is measured; measured SM120 calls cost ~0.1 ms
    ENQUEUE_MARGIN = 2.0  # the block lasts this many times the host's measured enqueue time
    MAX_REDOS = 4  # redone rounds in a row before giving up

    def __init__(self, device=None, *, block: bool = True, min_block_ms: float = MIN_BLOCK_MS,
                 initial_host_ms_per_call: float = INITIAL_HOST_MS_PER_CALL, max_redos: int = MAX_REDOS):
        self.device = device if device is not None else TorchCudaDevice()
        self.block = block
        self.min_block_ms = min_block_ms
        self.max_redos = max_redos
        self.host_ms_per_call = initial_host_ms_per_call
        self.stats = TimerStats()

    def block_ms_for(self, num_calls: int) -> float:
        """Length of the next blocking kernel for a round of `num_calls` calls."""
        return max(self.min_block_ms, self.ENQUEUE_MARGIN * self.host_ms_per_call * num_calls)

    def time_calls(self, calls: Sequence[Callable[[], object]], flush: Callable[[], None] | None = None) -> list[float]:
        """Milliseconds of each call, in order (the flush before each call is outside its events)."""
        if not calls:
            return []
        if not self.block:
            pairs, _ = self._enqueue(calls, flush)
            self.device.synchronize()
            self.stats.rounds += 1
            return [start.elapsed_time(end) for start, end in pairs]
        block_ms = self.block_ms_for(len(calls))
        for attempt in range(self.max_redos + 1):
            self.device.block(block_ms)
            guard = self.device.event()
            guard.record()
            pairs, enqueue_ms = self._enqueue(calls, flush)
            ran_dry = guard.query()  # the block finished before the host had enqueued the round
            self.device.synchronize()
            self.stats.blocks += 1
            self.stats.block_ms_total += block_ms
            self.stats.last_block_ms, self.stats.last_enqueue_ms = block_ms, enqueue_ms
            self.host_ms_per_call = enqueue_ms / len(calls)
            if not ran_dry:
                self.stats.rounds += 1
                return [start.elapsed_time(end) for start, end in pairs]
            if attempt < self.max_redos:
                self.stats.rounds_redone += 1
                block_ms = max(self.block_ms_for(len(calls)), 2 * block_ms)
        raise TimingError(
            f"block_covers_enqueue: the blocking kernel ran out before the host had enqueued the round's "
            f"{len(calls)} calls in {self.max_redos + 1} tries (last block {self.stats.last_block_ms:.3g} ms, "
            f"host enqueue {self.stats.last_enqueue_ms:.3g} ms); a call that waits for the device "
            f"(.item(), .cpu(), a synchronize) cannot be timed on device time alone"
        )

    def _enqueue(self, calls, flush):
        """Enqueue flush, start event, call, end event for every call; (event pairs, host milliseconds spent)."""
        pairs = []
        began = self.device.host_ms()
        for fn in calls:
            if flush is not None:
                flush()
            start, end = self.device.event(), self.device.event()
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        return pairs, self.device.host_ms() - began


class WallClockTimer:
    """Host time of each call (for CPU tensors, where CUDA events do not exist)."""

    def time_calls(self, calls: Sequence[Callable[[], object]], flush: Callable[[], None] | None = None) -> list[float]:
        """Milliseconds of each call, in order."""
        samples = []
        for fn in calls:
            if flush is not None:
                flush()
            start = perf_counter()
            fn()
            samples.append((perf_counter() - start) * 1e3)
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
    check: Callable[[list, int], list[str]] | None = None,
    refresh: Callable[[int], None] | None = None,
) -> dict[str, Timing]:
    """Time candidates against each other; `candidates[name][i]` runs the call on input set i.

    Warm-up calls (compiles, allocations, autotuning caches) run first and are not timed; each candidate
    runs on every input set at least once during warm-up. After each round, a candidate whose median so far
    exceeds its `give_up[name]` milliseconds is timed no further (its Timing has `stopped`): a config many
    times slower than the incumbent costs one round, not all of them.

    `refresh(round)` runs before each timed round, off the clock: steps rewrites every input set in place with new
    values there, so no output of an earlier call is right for a later one (issue 66).
    `check(calls, full_set) -> reasons ('' when right)` verifies what every timed call of a round returned, after its
    clock stopped: `calls` is the round's [(name, input set, output, started a thread)], outputs held by reference
    (no copy, nothing added on the device inside the timed window); the outputs on `full_set`, drawn from os.urandom
    after the round, are checked whole, the others on rows drawn then too. A failure ends that candidate's timing;
    its Timing has `incorrect` = the reason with the timed call's index.
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
    incorrect: dict[str, str] = {}
    checked: dict[str, int] = {name: 0 for name in candidates}
    for r, plan in enumerate(plans):
        plan = [(name, i) for name, i in plan if name not in stopped and name not in incorrect]
        if not plan:
            break
        if refresh is not None:
            refresh(r)
        held: list[object] = [None] * len(plan)
        threads = [False] * len(plan)
        calls = [candidates[name][i] if check is None else _holding(candidates[name][i], held, threads, j) for j, (name, i) in enumerate(plan)]
        times = timer.time_calls(calls, flush)
        for (name, _), ms in zip(plan, times):
            samples[name].append(ms)
        if check is not None:  # the clock has stopped: check the held outputs, then let them go
            for name, (reason, count) in _check_round(plan, held, threads, samples, check, num_sets).items():
                checked[name] += count
                if reason:
                    incorrect[name] = reason
            del held, calls
        if r + 1 < len(plans):  # a candidate timed to the end keeps its full record
            stopped |= {name for name, limit in give_up.items() if name in samples and statistics.median(samples[name]) > limit}
    return {
        name: Timing(tuple(values), stopped=name in stopped and name not in incorrect, incorrect=incorrect.get(name, ""), checked_calls=checked[name])
        for name, values in samples.items()
    }


def _holding(fn: Callable[[], object], held: list, threads: list, slot: int) -> Callable[[], object]:
    """The call, keeping what it returns in held[slot] (a reference: no copy, no device work) and in threads[slot]
    whether a thread was left running (deferred work: a host counter, read on each side)."""

    def call():
        before = _active_threads()
        held[slot] = fn()
        threads[slot] = _active_threads() > before
        return held[slot]

    return call


def random_index(n: int) -> int:
    """An index in [0, n) from os.urandom (bound at import): nothing in the process can predict or replace it."""
    return int.from_bytes(urandom(8), "little") % n


def _check_round(plan, held, threads, samples, check, num_sets: int) -> dict[str, tuple[str, int]]:
    """Per candidate of the round: (reason of its first failing call or '', calls checked). Every call is checked;
    the input set checked whole is drawn now, after the round."""
    full_set = random_index(num_sets)
    reasons = check([(name, i, held[j], threads[j]) for j, (name, i) in enumerate(plan)], full_set)
    position = {name: len(samples[name]) - sum(1 for n, _ in plan if n == name) for name, _ in plan}
    verdicts: dict[str, list] = {}
    for j, (name, i) in enumerate(plan):
        verdict = verdicts.setdefault(name, ["", 0])
        index, position[name] = position[name], position[name] + 1
        verdict[1] += 1
        if reasons[j] and not verdict[0]:
            how = "whole" if i == full_set else "sampled rows"
            verdict[0] = f"timed call {index} (input set {i}, checked after timing, {how}): {reasons[j]}"
    return {name: (reason, count) for name, (reason, count) in verdicts.items()}


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
