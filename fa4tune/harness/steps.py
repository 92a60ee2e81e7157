"""One step: one problem, one direction, one or more candidates: gate each, then time those that pass, interleaved.

`measure_step` runs a step in this process; `child_run_steps` is the child side of a step server
(fa4tune.harness.step_server): it runs steps in order and keeps what it loaded (the L2-flush buffer, the gate's
references, experiment modules) for the next call. A device fault ends the step's usefulness of the process:
StepContextLost, and the child retires.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from fa4tune.config import Problem
from fa4tune.harness import flops, gate, gpu, guards, isolation, memory_floor, runtime_guards, timing
from fa4tune.harness.candidates import Candidate, candidate_from_spec
from fa4tune.harness.measurement import ProblemResult
from fa4tune.harness.settings import (
    GATE_RANDOM_MAX_SEQLEN, GATE_SCALE, GATE_SEQLEN_OFFSET, GUARD_SEED_OFFSET, REFERENCE_CACHE_CPU_BYTES, REFERENCE_CACHE_FRACTION,
    Settings,
)


def _status_of_error(err: BaseException) -> str:
    """'guard' for a broken guardrail, 'compile_error' for errors raised by the CuTe DSL compiler, else 'crash'."""
    if isinstance(err, guards.GuardViolation):
        return "guard"
    module = type(err).__module__ or ""
    return "compile_error" if module.startswith("cutlass") else "crash"


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0][:400] if text else type(err).__name__


def _context_lost(err: BaseException) -> bool:
    """True after a device fault: the CUDA context is unusable and the process must be replaced."""
    text = f"{type(err).__name__} {err}"
    return "AcceleratorError" in text or "CUDA error" in text or "CUDA_ERROR" in text


def _release_cached_memory(device) -> None:
    """Give cached blocks back between steps; after a device fault this fails too, and that is not news."""
    import torch

    if torch.device(device).type != "cuda":
        return
    try:
        torch.cuda.empty_cache()
    except Exception:
        pass


class StepContextLost(RuntimeError):
    """A device fault made this process's CUDA context unusable; `results` holds what finished before."""

    def __init__(self, results: dict, remaining: list[str], reason: str):
        super().__init__(reason)
        self.results, self.remaining, self.reason = results, remaining, reason


def _worst_case_errors(gate_results: Sequence[gate.GateResult]) -> dict:
    """Per tensor, the error and tolerance of the case closest to failing."""
    worst: dict[str, tuple[float, gate.TensorCheck]] = {}
    for result in gate_results:
        for check in result.checks:
            ratio = check.error / check.tolerance if check.tolerance else float("inf")
            if check.name not in worst or ratio > worst[check.name][0]:
                worst[check.name] = (ratio, check)
    errors = {}
    for name, (_, check) in worst.items():
        errors[name] = check.error
        errors[f"{name}_tolerance"] = check.tolerance
    return errors


def gate_candidate(candidate: Candidate, problem: Problem, direction: str, device, settings: Settings,
                   references: gate.ReferenceCache | None = None) -> tuple[bool, dict, str]:
    """Run every gate case; (passed, max_errors record, reason of the first failure). A guarded candidate
    runs under the guards' trap, and after passing, its run-time guards; GuardViolation if one fails.
    `references` keeps the cases' references for the next candidate."""
    with runtime_guards.attention_trap() if candidate.guarded else contextlib.nullcontext():
        passed, errors, reason = _gate_cases(candidate, problem, direction, device, settings, references)
        if passed and candidate.guarded:
            runtime_guards.check_candidate(candidate.forward, problem, direction, device, settings.gate_seed + GUARD_SEED_OFFSET)
    return passed, errors, reason


def _gate_cases(candidate: Candidate, problem: Problem, direction: str, device, settings: Settings,
                references: gate.ReferenceCache | None = None) -> tuple[bool, dict, str]:
    cases = gate.gate_cases(
        problem, settings.gate_seed, scale=GATE_SCALE, seqlen_offset=GATE_SEQLEN_OFFSET,
        random_count=settings.gate_random_problems, random_max_seqlen=GATE_RANDOM_MAX_SEQLEN,
    )
    done = []
    for case in cases:
        q, k, v, dout = gate.random_inputs(case.problem, case.seed, device, scale=case.scale, count=4, kind=case.kind)
        if direction == "fwd":
            # a paged problem's cases: pages shuffled, sequences of different used lengths (gate.paging)
            result = gate.gate_forward(
                candidate.forward, q, k, v, problem.causal, variant=case.variant, seed=case.seed,
                chunk_bytes=settings.reference_chunk_bytes, references=references, input_scale=case.scale,
                lengths=case.problem.lengths, precision=problem.dtype, **gate.call_arguments(problem),
                **gate.paging(case.problem, device, case.seed, ragged=True),
            )
        else:
            result = gate.gate_backward(
                candidate.forward, q, k, v, problem.causal, dout, variant=case.variant, seed=case.seed,
                chunk_bytes=settings.reference_chunk_bytes, references=references, input_scale=case.scale,
                lengths=case.problem.lengths, **gate.call_arguments(problem),
            )
        del q, k, v, dout
        done.append(result)
        if not result.passed:
            return False, {**result.max_errors(), "gate_seed": settings.gate_seed}, result.reason
    return True, {**_worst_case_errors(done), "gate_seed": settings.gate_seed, "gate_cases": len(done)}, ""


class TimedCall:
    """One input set of one candidate: the zero-argument call timed (the backward: the gradients only, through this
    round's graph, made off the clock), its tensors, rewritten in place between rounds, and a packed problem's
    cu_seqlens. `trapped`: each call and forward under its own runtime_guards trap (a guarded candidate timed
    beside unguarded ones)."""

    def __init__(self, candidate: Candidate, problem: Problem, direction: str, device, seed: int, trapped: bool = False):
        self.forward, self.causal, self.trapped = candidate.forward, problem.causal, trapped
        # a packed problem's cu_seqlens, the problem's window and soft-cap (gate.call_arguments), a paged one's table
        self.packed = {**gate.packing(problem.lengths, device), **gate.call_arguments(problem),
                       **gate.paging(problem, device, seed)}
        q, k, v, dout = gate.random_inputs(problem, seed, device, count=4)
        self.forward_outputs = None  # the backward's (out, lse) of this round's graph
        if direction == "bwd":
            q, k, v = (t.requires_grad_() for t in (q, k, v))
        self.inputs = (q, k, v, dout)
        if direction == "bwd":
            self.rebuild()

    def _trap(self):
        return runtime_guards.attention_trap() if self.trapped else contextlib.nullcontext()

    def rebuild(self) -> None:
        """A new graph of the inputs as they are now (the backward's forward, off the clock)."""
        import torch

        q, k, v, _ = self.inputs
        self.forward_outputs = None  # the last round's graph goes first
        with self._trap(), torch.enable_grad():
            self.forward_outputs = gate._unpack(self.forward(q, k, v, self.causal, **self.packed))

    def rewrite(self, values) -> None:
        """New values into the same tensors (same data_ptr and version counter), and for the backward a new graph."""
        for t, value in zip(self.inputs, values):
            t.data.copy_(value)
        if self.forward_outputs is not None:
            self.rebuild()

    def __call__(self):
        import torch

        q, k, v, dout = self.inputs
        with self._trap():
            if self.forward_outputs is None:
                with torch.no_grad():
                    return self.forward(q, k, v, self.causal, **self.packed)
            return torch.autograd.grad(self.forward_outputs[0], (q, k, v), dout, retain_graph=True)


def timed_calls(candidate: Candidate, problem: Problem, direction: str, device, seeds: Sequence[int], trapped: bool = False) -> list[TimedCall]:
    """One call per input set (TimedCall)."""
    return [TimedCall(candidate, problem, direction, device, seed, trapped) for seed in seeds]


def _guard_text(rule: str, detail: str) -> str:
    return str(guards.GuardViolation(rule, detail))


class TimedOutputCheck:
    """timing.benchmark's `refresh` and `check` (issue 66). Before each round, off the clock: the harness's bound
    functions verified, every input set rewritten in place with values drawn from os.urandom (the same for every
    candidate; kept here as the copy the references come from). After it: every timed call's output against those
    values, with the gate's rule, whole on the input set drawn after the round, on rows drawn then on the others;
    and the guards of the call itself: its inputs unchanged (input_write), no thread left running (deferred_work),
    no memory shared with an input or another output of the round, not the output the same input set gave the
    round before (output_reuse). `spent["check"]` adds up its seconds (outside the clock)."""

    def __init__(self, problem: Problem, direction: str, calls: dict[str, list[TimedCall]], settings: Settings,
                 references: gate.ReferenceCache | None, device, spent: dict | None = None, guarded: bool = True):
        self.problem, self.direction, self.calls, self.settings, self.device = problem, direction, calls, settings, device
        self.guarded = guarded  # a guarded candidate is timed: the harness's bound functions are verified each round
        # the timed input sets' references, each computed once for every candidate's check
        self.references = references if references is not None else gate.ReferenceCache(REFERENCE_CACHE_CPU_BYTES)
        self.spent = {} if spent is None else spent
        self.spent.setdefault("check", 0.0)
        # per input set: (seed, [q, k, v, dout]) of this round, and of the round before (at first, as the sets were made)
        self.values: list[tuple[int | None, list]] = [(None, [t.detach().clone() for t in c.inputs]) for c in next(iter(calls.values()))]
        self.previous = self.values
        self.fingerprints: dict[tuple[str, int], list[int]] = {}

    def refresh(self, round_index: int) -> None:
        """New values in every input set (and a new graph for the backward), before round `round_index`."""
        began = time.perf_counter()
        if self.guarded:
            runtime_guards.raise_if_tampered()
        num_sets = len(next(iter(self.calls.values())))
        self.previous, self.values = self.values, []
        for i in range(num_sets):
            seed = timing.random_index(2**31)
            values = gate.random_inputs(self.problem, seed, self.device, count=4)
            self.values.append((seed, values))
            for calls in self.calls.values():
                calls[i].rewrite(values)
        self.spent["check"] += time.perf_counter() - began

    def __call__(self, round_calls: list, full_set: int) -> list[str]:
        import torch

        began = time.perf_counter()
        rows = runtime_guards.sample_rows(self.problem.seqlen_q, runtime_guards.SAMPLED_ROWS, timing.random_index(2**31))
        draw = timing.random_index(2**31)  # which sequence of a packed or paged call the sampled rows come from
        outputs = [self._named(output) for _, _, output, _ in round_calls]
        reasons = []
        try:
            with torch.no_grad():
                for j, (name, i, _, threaded) in enumerate(round_calls):
                    others = {f"the {key} of call {m + 1} of the round": t for m, named in enumerate(outputs) if m != j
                              for key, t in named.items() if isinstance(t, torch.Tensor)}
                    reasons.append(self._one(name, i, outputs[j], threaded, others, i == full_set, rows, draw))
        finally:
            self.spent["check"] += time.perf_counter() - began
        return reasons

    def _named(self, output) -> dict:
        if self.direction == "fwd":
            out, lse = gate._unpack(output)
            return {"out": out, "lse": lse}
        grads = list(output) if isinstance(output, (tuple, list)) else [output]
        return dict(zip(("dq", "dk", "dv"), grads + [None] * (3 - len(grads))))

    def _one(self, name: str, i: int, named: dict, threaded: bool, others: dict, whole: bool, rows, draw: int) -> str:
        import torch

        call = self.calls[name][i]
        seed, (q, k, v, dout) = self.values[i]
        if threaded:
            return _guard_text(guards.DEFERRED_WORK, "the timed call left a thread running when it returned")
        for label, now, before in zip(("q", "k", "v", "dout"), call.inputs, (q, k, v, dout)):
            if not torch.equal(now.detach(), before):
                return _guard_text(guards.INPUT_WRITE, f"the timed call changed its input {label}")
        tensors = {key: t for key, t in named.items() if isinstance(t, torch.Tensor)}
        inputs = {f"input {label} of set {m}": t for m, c in enumerate(self.calls[name]) for label, t in zip(("q", "k", "v", "dout"), c.inputs)}
        for key, t in tensors.items():
            for other, value in {**inputs, **others}.items():
                if runtime_guards.shares_memory(t, value):
                    return _guard_text(guards.OUTPUT_REUSE, f"its {key} shares memory with {other}")
        fingerprint = gate._checksum(list(tensors.values()))
        before = self.fingerprints.get((name, i))
        self.fingerprints[(name, i)] = fingerprint
        if before == fingerprint:
            return _guard_text(guards.OUTPUT_REUSE, f"returned the {', '.join(tensors)} its call on input set {i} returned the "
                                                    "round before, though the set's values were rewritten since")
        try:
            found = self._compare(call, named, (q, k, v, dout), seed, whole, rows, draw)
            if found and not self._compare(call, named, self.previous[i][1], None, False, rows, draw):
                return _guard_text(guards.OUTPUT_REUSE, f"its {', '.join(tensors)} follow the values input set {i} held before "
                                                        f"it was rewritten, not its own ({found})")
            return found
        except Exception as err:  # an output that cannot be compared is not a right one
            return f"its output cannot be checked: {_one_line(err)}"

    def _compare(self, call: TimedCall, named: dict, inputs, seed: int, whole: bool, rows, draw: int) -> str:
        """'' when the output matches the reference of this round's values (whole, or on `rows`), else the reason."""
        q, k, v, dout = inputs
        problem, chunk = self.problem, self.settings.reference_chunk_bytes
        mask = gate.call_arguments(problem)
        if problem.page_size:  # the call's page table and used lengths
            mask.update(page_table=call.packed["page_table"], seqused_k=call.packed["seqused_k"])
        if not whole:
            if call.forward_outputs is None:
                return runtime_guards.rows_mismatch(q, k, v, problem.causal, rows, out=named["out"], lse=named["lse"],
                                                    lengths=problem.lengths, precision=problem.dtype, draw=draw, **mask)
            return runtime_guards.rows_mismatch(q, k, v, problem.causal, rows, dout=dout, dq=named["dq"], lengths=problem.lengths,
                                                draw=draw, **mask)
        if call.forward_outputs is None:
            result = gate.check_outputs(q, k, v, problem.causal, named["out"], named["lse"], variant="timed", seed=seed,
                                        chunk_bytes=chunk, references=self.references, lengths=problem.lengths, precision=problem.dtype,
                                        **mask)
        else:
            out, lse = call.forward_outputs
            out, lse = out.detach(), (lse.detach() if lse is not None else None)
            grads = (named["dq"], named["dk"], named["dv"])
            result = gate.check_outputs(q, k, v, problem.causal, out, lse, grads, dout, variant="timed", seed=seed,
                                        chunk_bytes=chunk, references=self.references, lengths=problem.lengths, **mask)
        return "" if result.passed else result.reason


def _guards_after_timing(guarded: Sequence[Candidate], problem: Problem, direction: str, device, settings: Settings) -> dict[str, tuple[str, str]]:
    """The run-time guards again, on fresh inputs, once every candidate is timed: a candidate that turns to
    caching (by data_ptr), lazy or deferred work after its gate and first guard calls is caught here.
    {name: (status, reason)} of those that fail."""
    failed = {}
    for c in guarded:
        try:
            with runtime_guards.attention_trap():
                runtime_guards.check_candidate(c.forward, problem, direction, device, settings.gate_seed + GUARD_SEED_OFFSET + 1)
        except Exception as err:
            if _context_lost(err):
                raise
            failed[c.name] = (_status_of_error(err), f"after timing: {_one_line(err)}")
    return failed


def _peak_memory_mb(candidate: Candidate, problem: Problem, direction: str, device, seed: int) -> float | None:
    """GPU memory one call needs (its inputs, outputs and workspace), from the allocator's peak."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    q, k, v, dout = gate.random_inputs(problem, seed, device, count=4)
    packed = {**gate.packing(problem.lengths, device), **gate.call_arguments(problem), **gate.paging(problem, device, seed)}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)  # the inputs count (allocated now), making them does not
    if direction == "fwd":
        with torch.no_grad():
            candidate.forward(q, k, v, problem.causal, **packed)
    else:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out, _ = candidate.forward(q, k, v, problem.causal, **packed)
        torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def make_flusher(device):
    """The L2 flusher of a CUDA device (None on the CPU)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return timing.L2Flusher(timing.l2_flush_bytes(l2), device)


def measure_step(
    problem: Problem,
    direction: str,
    candidates: Sequence[Candidate],
    *,
    device,
    settings: Settings,
    timer=None,
    flusher=None,
    references: gate.ReferenceCache | None = None,
    give_up_ms: float | None = None,
    seconds: dict | None = None,
    memory_bandwidth: float | None = None,
) -> dict[str, ProblemResult]:
    """Gate every candidate on the problem, then time those that pass against each other; one whose median
    passes `give_up_ms` after a round is timed no further and is `pruned` (None: every candidate timed fully).
    `seconds`, when given, gets the wall time spent in "gate" (first calls, so kernel loads and compiles
    included) and in "timing" (peak memory, inputs, warm-up and timed calls; of it, "check": rewriting the inputs
    between rounds and checking every timed output). A time below the problem's memory floor at `memory_bandwidth`
    bytes per second (default: the CUDA device's figure, none on the CPU) is refused (below_memory_floor).

    Raises StepContextLost after a device fault (the caller replaces the process).
    """
    seconds = {} if seconds is None else seconds
    started = time.perf_counter()
    try:
        return _measure_step(problem, direction, candidates, device, settings, timer, flusher, references, give_up_ms, seconds, started,
                             memory_bandwidth)
    finally:
        total = time.perf_counter() - started
        seconds.setdefault("gate", total)  # (set where the gate ends; unset when it raised)
        seconds["timing"] = total - seconds["gate"]  # (includes "check": the timed outputs' check, outside the clock)


def _measure_step(problem, direction, candidates, device, settings, timer, flusher, references, give_up_ms, seconds, started,
                  memory_bandwidth):
    import torch

    results: dict[str, ProblemResult] = {}
    passed: list[tuple[Candidate, dict]] = []
    is_cuda = torch.device(device).type == "cuda"
    for i, candidate in enumerate(candidates):
        try:
            ok, errors, reason = gate_candidate(candidate, problem, direction, device, settings, references)
        except Exception as err:  # the candidate's failure is its result; the others go on
            results[candidate.name] = ProblemResult(problem.label, direction, _status_of_error(err), reason=_one_line(err))
            if _context_lost(err):  # (on any device: a process that reports a CUDA error is not trusted again)
                raise StepContextLost(results, [c.name for c in candidates[i + 1:]], _one_line(err)) from err
            continue
        finally:
            _release_cached_memory(device)
        if ok:
            passed.append((candidate, errors))
        else:
            results[candidate.name] = ProblemResult(problem.label, direction, "incorrect", max_errors=errors, reason=reason)
    seconds["gate"] = time.perf_counter() - started
    if not passed:
        return results
    # The run-time trap stays set while guarded candidates are timed: one trap around everything when every
    # candidate is guarded, else one per guarded call (the unguarded ones, e.g. SDPA's baseline, are not trapped).
    every_guarded = all(c.guarded for c, _ in passed)
    try:
        with runtime_guards.attention_trap() if every_guarded else contextlib.nullcontext():
            memory = {c.name: _peak_memory_mb(c, problem, direction, device, settings.gate_seed + 99) for c, _ in passed}
            seeds = [settings.gate_seed + 100 + i for i in range(settings.input_sets)]
            calls = {c.name: timed_calls(c, problem, direction, device, seeds, trapped=c.guarded and not every_guarded) for c, _ in passed}
            checker = TimedOutputCheck(problem, direction, calls, settings, references, device, seconds,
                                       guarded=any(c.guarded for c, _ in passed))
            timings = timing.benchmark(
                calls, timer=timer or (timing.CudaEventTimer() if is_cuda else timing.WallClockTimer()),
                flush=flusher, warmup=settings.warmup, rounds=settings.rounds, seed=settings.gate_seed,
                give_up=None if give_up_ms is None else {c.name: give_up_ms for c, _ in passed},
                check=checker, refresh=checker.refresh,
            )
        del calls, checker
        after = _guards_after_timing([c for c, _ in passed if c.guarded and not timings[c.name].incorrect], problem, direction, device, settings)
    except Exception as err:
        status, reason = _status_of_error(err), f"while timing: {_one_line(err)}"
        for c, errors in passed:
            results[c.name] = ProblemResult(problem.label, direction, status, max_errors=errors, reason=reason)
        if _context_lost(err):
            raise StepContextLost(results, [], reason) from err
        return results
    count = flops.problem_flops(problem, direction)
    bandwidth = memory_bandwidth if memory_bandwidth is not None or not is_cuda else gpu.device_bandwidth(torch.cuda.get_device_name(device))
    for c, errors in passed:
        t = timings[c.name]
        status, reason = "ok", ""
        if t.incorrect:  # a wrong output, or a guard of the timed call itself (its reason names the rule)
            status, reason = ("guard" if ": guard " in t.incorrect else "incorrect"), t.incorrect
        elif c.name in after:
            status, reason = after[c.name]
        elif impossible := memory_floor.below_floor(problem, direction, t.min_ms, bandwidth):
            status, reason = "guard", _guard_text(guards.BELOW_MEMORY_FLOOR, impossible)
        elif t.stopped:
            status = "pruned"
            count_text = f"{len(t.samples_ms)} sample{'s' if len(t.samples_ms) != 1 else ''}"
            reason = f"stopped after {count_text}: median {t.median_ms:.4g} ms > {give_up_ms:.4g} ms (give-up threshold)"
        results[c.name] = ProblemResult(
            problem.label, direction, status, tflops=flops.tflops(count, t.median_ms),
            ms_median=t.median_ms, ms_min=t.min_ms, ms_max=t.max_ms, ms_q1=t.q1_ms, ms_q3=t.q3_ms, max_errors=errors, reason=reason,
            peak_vram_mb=memory[c.name],
        )
    return results


# ------------------------------------------------------------------------------------------------
# Steps in a child process: one child runs steps in order, keeps what it loaded for the next call, and is
# replaced after a crash, a hang or a device fault; only the step in flight is lost.
# ------------------------------------------------------------------------------------------------


@dataclass
class Step:
    """One (problem, direction) with the candidates to run on it (as JSON specs); a candidate whose median
    passes `give_up_ms` milliseconds after a timed round is timed no further (`pruned`)."""

    problem: Problem
    direction: str
    specs: list[dict]
    give_up_ms: float | None = None

    def to_dict(self) -> dict:
        return {"problem": self.problem.to_dict(), "direction": self.direction, "specs": self.specs, "give_up_ms": self.give_up_ms}


@dataclass
class _ChildState:
    """What a step child keeps between steps and calls, per device."""

    flusher: object
    references: gate.ReferenceCache


_CHILD_STATE: dict[str, _ChildState] = {}


def _child_state(device: str) -> _ChildState:
    """The L2 flusher and the gate's reference cache of this process, made on first use."""
    import torch

    if device not in _CHILD_STATE:
        if torch.device(device).type == "cuda":
            memory = torch.cuda.get_device_properties(device).total_memory
            references = gate.ReferenceCache(memory // REFERENCE_CACHE_FRACTION)
        else:
            references = gate.ReferenceCache(REFERENCE_CACHE_CPU_BYTES)
        _CHILD_STATE[device] = _ChildState(make_flusher(device), references)
    return _CHILD_STATE[device]


def child_run_steps(steps: list[dict], settings: dict, device: str = "cuda") -> Iterator[dict]:
    """Child side: for each step yield {"started": i}, then {"step": i, "results": {...}} (with "retry":
    the candidates still to run, after a device fault ended this process's usefulness: it retires)."""
    config = Settings(**settings)
    state = _child_state(device)
    for i, data in enumerate(steps):
        yield {"started": i}  # the time limit runs per step from here, not from the process start
        problem, direction = Problem.from_dict(data["problem"]), data["direction"]
        candidates, results = [], {}
        for spec in data["specs"]:
            try:
                candidates.append(candidate_from_spec(spec))
            except Exception as err:  # e.g. experiment.py does not import: that candidate's result, not a crash
                results[spec["name"]] = ProblemResult(problem.label, direction, "crash", reason=f"cannot build the candidate: {_one_line(err)}")
        seconds: dict = {}
        try:
            results.update(measure_step(problem, direction, candidates, device=device, settings=config, flusher=state.flusher,
                                        references=state.references, give_up_ms=data.get("give_up_ms"), seconds=seconds))
        except StepContextLost as lost:
            results.update(lost.results)
            isolation.retire()  # this process's CUDA context is gone: the server starts a fresh one
            yield {"step": i, "results": {k: r.to_dict() for k, r in results.items()}, "retry": lost.remaining, "seconds": seconds}
            return
        yield {"step": i, "results": {k: r.to_dict() for k, r in results.items()}, "seconds": seconds}
        _release_cached_memory(device)
