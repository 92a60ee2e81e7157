"""prepare.py: the fixed benchmark harness. The coding agent edits experiment.py, never this file.

Every evaluation in the project goes through here: for each (config, problem, direction) the static
feasibility rules of the target (an infeasible config is never run), the correctness gate on several input
cases (fa4tune.harness.gate; a failing config is `incorrect` and never timed), then timing (fa4tune.harness.timing: warm-up,
L2 flushed, rotated input sets, interleaved candidates, median with spread; a candidate past its give-up
threshold is `pruned`) in a child process with a time limit (fa4tune.harness.step_server: one child kept for a
whole run; a segfault, CUDA fault or hang costs only that step). experiment.py's candidates run under the
guardrails of fa4tune.guards (static rules on its source, a trap for other attention implementations and
side streams, output-reuse and lazy-output checks; a violation is status `guard`), and a run refuses to
start when prepare.py or a measuring module differs from its pinned hash.

    uv run python experiment.py > run.log          # experiment.py's dispatch table (calls run_experiment)
    uv run python prepare.py --baseline            # upstream SM120 defaults vs FA4's own path vs torch SDPA
    uv run python prepare.py --self-check          # the gate catches unwritten and wrong outputs on this GPU

Every line says `target=sm120 device=<name> mode=native|emulated`: on a GPU that is not SM 12.0 the SM120
kernels run emulated (upstream's SM120 classes compiled for the local GPU) and the rates are that GPU's.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Sequence

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# ------------------------------------------------------------------------------------------------
# The harness's fixed settings.
# ------------------------------------------------------------------------------------------------
DEFAULT_SUITE = "standard"
RESULTS_TSV = Path(os.environ.get("FA4TUNE_RESULTS_TSV", ROOT / "results.tsv"))  # e.g. $OUT/results.tsv on a lent GPU
EXPERIMENT_PATH = ROOT / "experiment.py"
STEP_TIME_LIMIT_S = 300.0  # one (problem, direction) in a child: compile, gate and timing
STARTUP_TIME_LIMIT_S = 180.0  # a child's imports (torch, the CuTe DSL) before its first step
WARMUP_CALLS = 3  # untimed calls per candidate first (the first one compiles)
TIMED_ROUNDS = 10  # rounds of interleaved timed calls; each round calls every input set once
INPUT_SETS = 3  # random input sets rotated between timed calls
GATE_SCALE = 8.0  # inputs multiplied by this in the large-magnitude gate case
GATE_SEQLEN_OFFSET = 37  # the gate case with sequence lengths that are not tile multiples
GATE_RANDOM_PROBLEMS = 2  # small problems of the same class drawn at run time (seed recorded)
GATE_RANDOM_MAX_SEQLEN = 1024
REFERENCE_CHUNK_BYTES = 2 << 30  # fp32 reference computed in chunks of this many score bytes
REFERENCE_CACHE_FRACTION = 8  # a step server keeps gate references in up to 1/8 of the device's memory
REFERENCE_CACHE_CPU_BYTES = 1 << 30  # (on the CPU: tests)
GUARD_SEED_OFFSET = 7  # the run-time guards' inputs: gate seed + this (other values than every gate case)

# Candidate kinds a step can run (baseline names as printed).
EXPERIMENT, UPSTREAM_SM120, FA4_OWN_PATH, TORCH_SDPA = "experiment", "sm120 upstream", "fa4 own path", "torch sdpa"


# ------------------------------------------------------------------------------------------------
# Command line (main() is at the end): parsed before the imports below, which take seconds (torch), so that
# --help and bad arguments answer at once.
# ------------------------------------------------------------------------------------------------

from fa4tune.cli import CommandParser, positive_seconds  # noqa: E402


def _parser() -> CommandParser:
    """prepare.py's options (one `error:` line and exit 2 for a bad one)."""
    parser = CommandParser(
        prog="prepare.py",
        description="The fixed benchmark harness: correctness gate, timing, metric lines, results.tsv. "
        "Tuned configs run through experiment.py (`python experiment.py > run.log`).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--baseline", action="store_true", help="time upstream's SM120 defaults, FA4's own path for this GPU and torch SDPA")
    action.add_argument("--experiment", metavar="PATH", help="run the dispatch table of an experiment file (as `python experiment.py` does)")
    action.add_argument("--self-check", action="store_true", help="show the gate catches planted faults on this GPU, and the timer's spread")
    parser.add_argument("--suite", default=DEFAULT_SUITE, help=f"suite name (suites/*.json) or path to a suite file (default: {DEFAULT_SUITE})")
    parser.add_argument("--only", metavar="TEXT", help="only the problems whose name contains TEXT")
    parser.add_argument("--time-limit", type=positive_seconds, default=STEP_TIME_LIMIT_S, help=f"seconds per step before a child is killed (default: {STEP_TIME_LIMIT_S:g})")
    parser.add_argument("--description", default="", help="free text for the results.tsv row (--experiment)")
    return parser


if __name__ == "__main__":
    _parser().parse_args()  # exits here for --help and bad arguments; main() parses again

from fa4tune import defaults  # noqa: E402
from fa4tune.harness import flops, gate, gpu, guards, isolation, metrics, results_tsv, step_server, timing  # noqa: E402
from fa4tune.config import BackwardConfig, ConfigError, ForwardConfig, Problem  # noqa: E402
from fa4tune.feasibility import check_backward, check_forward_problem  # noqa: E402
from fa4tune.harness.measurement import Measurement, ProblemResult  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402
from fa4tune.targets import Target, get_target  # noqa: E402


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


# ------------------------------------------------------------------------------------------------
# Candidates: what a step runs. A forward is `forward(q, k, v, causal) -> (out, lse or None)`,
# differentiable through autograd; q, k, v are (batch, seqlen, heads, head_dim).
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A named attention implementation under test, and what the record says about it."""

    name: str
    forward: Callable
    config: dict
    guarded: bool = False  # experiment.py's code: gated under fa4tune.guards' trap and run-time checks


def experiment_candidate(experiment_module, fwd_config: ForwardConfig, bwd_config: BackwardConfig, name: str = EXPERIMENT) -> Candidate:
    """experiment.attention with these configs."""

    def forward(q, k, v, causal):
        return experiment_module.attention(q, k, v, causal=causal, fwd_config=fwd_config, bwd_config=bwd_config, return_lse=True)

    return Candidate(name, forward, {"forward": fwd_config.to_dict(), "backward": bwd_config.to_dict()}, guarded=True)


def fa4_candidate() -> Candidate:
    """FlashAttention-4's public path for the local GPU (no arch override: SM90 kernels on an H200)."""
    from flash_attn.cute.interface import flash_attn_func

    def forward(q, k, v, causal):
        out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
        return out, lse

    return Candidate(FA4_OWN_PATH, forward, {"path": "flash_attn.cute.interface.flash_attn_func"})


def sdpa_candidate() -> Candidate:
    """torch.nn.functional.scaled_dot_product_attention (GQA through enable_gqa; no LSE to check)."""
    import torch
    import torch.nn.functional as F

    def forward(q, k, v, causal):
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        mask, is_causal = None, causal
        if causal and seqlen_q != seqlen_k:
            # SDPA's is_causal is top-left aligned; FlashAttention's (and the gate's) is bottom-right
            mask = ~gate.causal_mask(torch.arange(seqlen_q, device=q.device), seqlen_q, seqlen_k, seqlen_k)
            is_causal = False
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=is_causal,
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2), None

    return Candidate(TORCH_SDPA, forward, {"path": "torch.nn.functional.scaled_dot_product_attention"})


_EXPERIMENTS: dict[Path, tuple[str, object]] = {}  # path -> (sha256 of the source it ran, module)


def load_experiment(path: str | Path):
    """Import experiment.py (or a copy of it) from a path, as module `experiment`; the module already loaded
    from that path while its source is unchanged (its kernels' compile caches with it), else a fresh import."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ConfigError("experiment_file", f"{str(path)!r} does not exist")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    known = _EXPERIMENTS.get(path)
    if known is not None and known[0] == digest:
        sys.modules["experiment"] = known[1]  # the kernels' classes look their module up by name
        return known[1]
    cached = sys.modules.get("experiment")
    if known is None and cached is not None and Path(getattr(cached, "__file__", "")).resolve() == path:
        _EXPERIMENTS[path] = (digest, cached)  # imported by name (`import experiment`) before
        return cached
    spec = importlib.util.spec_from_file_location("experiment", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["experiment"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["experiment"]  # a later call must not get the half-imported module
        raise
    _EXPERIMENTS[path] = (digest, module)
    return module


def _candidate_from_spec(spec: dict) -> Candidate:
    """A Candidate from its JSON description (what travels to a child process)."""
    kind = spec["kind"]
    if kind in (EXPERIMENT, UPSTREAM_SM120):
        module = load_experiment(spec["experiment_path"])
        return experiment_candidate(
            module, ForwardConfig.from_dict(spec["fwd_config"]), BackwardConfig.from_dict(spec["bwd_config"]), spec["name"],
        )
    if kind == FA4_OWN_PATH:
        return fa4_candidate()
    if kind == TORCH_SDPA:
        return sdpa_candidate()
    if kind == "callable":
        # {"factory": "module:function"} returning a Candidate: any other implementation under test
        return isolation.resolve(spec["factory"])()
    raise ValueError(f"unknown candidate kind {kind!r}")


def experiment_spec(name: str, experiment_path: str | Path, fwd_config: ForwardConfig, bwd_config: BackwardConfig, kind: str = EXPERIMENT) -> dict:
    """JSON description of an experiment.attention candidate."""
    return {
        "name": name, "kind": kind, "experiment_path": str(experiment_path),
        "fwd_config": fwd_config.to_dict(), "bwd_config": bwd_config.to_dict(),
    }


# ------------------------------------------------------------------------------------------------
# One step: one problem, one direction, one or more candidates (gate each, then time them interleaved).
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How thoroughly a step gates and times (the module constants, or smaller ones in tests)."""

    gate_seed: int
    warmup: int = WARMUP_CALLS
    rounds: int = TIMED_ROUNDS
    input_sets: int = INPUT_SETS
    gate_random_problems: int = GATE_RANDOM_PROBLEMS
    reference_chunk_bytes: int = REFERENCE_CHUNK_BYTES

    def to_dict(self) -> dict:
        return asdict(self)


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
    runs under fa4tune.guards' trap, and after passing, its run-time guards; GuardViolation if one fails.
    `references` keeps the cases' references for the next candidate."""
    with guards.attention_trap() if candidate.guarded else contextlib.nullcontext():
        passed, errors, reason = _gate_cases(candidate, problem, direction, device, settings, references)
        if passed and candidate.guarded:
            guards.check_candidate(candidate.forward, problem, direction, device, settings.gate_seed + GUARD_SEED_OFFSET)
    return passed, errors, reason


def _gate_cases(candidate: Candidate, problem: Problem, direction: str, device, settings: Settings,
                references: gate.ReferenceCache | None = None) -> tuple[bool, dict, str]:
    cases = gate.gate_cases(
        problem, settings.gate_seed, scale=GATE_SCALE, seqlen_offset=GATE_SEQLEN_OFFSET,
        random_count=settings.gate_random_problems, random_max_seqlen=GATE_RANDOM_MAX_SEQLEN,
    )
    done = []
    for case in cases:
        q, k, v, dout = gate.random_inputs(case.problem, case.seed, device, scale=case.scale, count=4)
        if direction == "fwd":
            result = gate.gate_forward(
                candidate.forward, q, k, v, problem.causal, variant=case.variant, seed=case.seed,
                chunk_bytes=settings.reference_chunk_bytes, references=references, input_scale=case.scale,
            )
        else:
            result = gate.gate_backward(
                candidate.forward, q, k, v, problem.causal, dout, variant=case.variant, seed=case.seed,
                chunk_bytes=settings.reference_chunk_bytes, references=references, input_scale=case.scale,
            )
        del q, k, v, dout
        done.append(result)
        if not result.passed:
            return False, {**result.max_errors(), "gate_seed": settings.gate_seed}, result.reason
    return True, {**_worst_case_errors(done), "gate_seed": settings.gate_seed, "gate_cases": len(done)}, ""


def _timed_calls(candidate: Candidate, problem: Problem, direction: str, device, seeds: Sequence[int]) -> list[Callable]:
    """One zero-argument call per input set; backward calls time only the backward (forward done here)."""
    import torch

    calls = []
    for seed in seeds:
        q, k, v, dout = gate.random_inputs(problem, seed, device, count=4)
        if direction == "fwd":
            def call(q=q, k=k, v=v):
                with torch.no_grad():
                    return candidate.forward(q, k, v, problem.causal)
        else:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            out, _ = candidate.forward(q, k, v, problem.causal)

            def call(out=out, q=q, k=k, v=v, dout=dout):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        calls.append(call)
    return calls


def _peak_memory_mb(candidate: Candidate, problem: Problem, direction: str, device, seed: int) -> float | None:
    """GPU memory one call needs (its inputs, outputs and workspace), from the allocator's peak."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    q, k, v, dout = gate.random_inputs(problem, seed, device, count=4)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)  # the inputs count (allocated now), making them does not
    if direction == "fwd":
        with torch.no_grad():
            candidate.forward(q, k, v, problem.causal)
    else:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out, _ = candidate.forward(q, k, v, problem.causal)
        torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def _make_flusher(device):
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
) -> dict[str, ProblemResult]:
    """Gate every candidate on the problem, then time those that pass against each other; one whose median
    passes `give_up_ms` after a round is timed no further and is `pruned` (None: every candidate timed fully).
    `seconds`, when given, gets the wall time spent in "gate" (first calls, so kernel loads and compiles
    included) and in "timing" (peak memory, inputs, warm-up and timed calls).

    Raises StepContextLost after a device fault (the caller replaces the process).
    """
    seconds = {} if seconds is None else seconds
    started = time.perf_counter()
    try:
        return _measure_step(problem, direction, candidates, device, settings, timer, flusher, references, give_up_ms, seconds, started)
    finally:
        total = time.perf_counter() - started
        seconds.setdefault("gate", total)  # (set where the gate ends; unset when it raised)
        seconds["timing"] = total - seconds["gate"]


def _measure_step(problem, direction, candidates, device, settings, timer, flusher, references, give_up_ms, seconds, started):
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
    try:
        memory = {c.name: _peak_memory_mb(c, problem, direction, device, settings.gate_seed + 99) for c, _ in passed}
        seeds = [settings.gate_seed + 100 + i for i in range(settings.input_sets)]
        calls = {c.name: _timed_calls(c, problem, direction, device, seeds) for c, _ in passed}
        timings = timing.benchmark(
            calls, timer=timer or (timing.CudaEventTimer() if is_cuda else timing.WallClockTimer()),
            flush=flusher, warmup=settings.warmup, rounds=settings.rounds, seed=settings.gate_seed,
            give_up=None if give_up_ms is None else {c.name: give_up_ms for c, _ in passed},
        )
    except Exception as err:
        status, reason = _status_of_error(err), f"while timing: {_one_line(err)}"
        for c, errors in passed:
            results[c.name] = ProblemResult(problem.label, direction, status, max_errors=errors, reason=reason)
        if _context_lost(err):
            raise StepContextLost(results, [], reason) from err
        return results
    count = flops.problem_flops(problem, direction)
    for c, errors in passed:
        t = timings[c.name]
        status, reason = "ok", ""
        if t.stopped:
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
# Steps in a child process (fa4tune.harness.step_server): one child runs steps in order, keeps what it loaded
# for the next call, and is replaced after a crash, a hang or a device fault; only the step in flight is lost.
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
        _CHILD_STATE[device] = _ChildState(_make_flusher(device), references)
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
                candidates.append(_candidate_from_spec(spec))
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


def new_step_server(*, env: dict | None = None, target: Target | None = None, device: str = "cuda",
                    timeout_s: float = STEP_TIME_LIMIT_S, log_path: str | None = None) -> step_server.StepServer:
    """A step server for this harness (one per GPU for a whole run; close it, or use it in a `with`).
    `env`: the kernels' environment; with `target` instead, this GPU's (emulation variables where it is not one)."""
    if env is None and target is not None:
        info = gpu.read_device()
        env = gpu.kernel_env(info, target, gpu.select_mode(info, target))
    return step_server.StepServer(env=env, device=device, cwd=str(ROOT), sys_path=[str(ROOT)], timeout_s=timeout_s,
                                  startup_timeout_s=STARTUP_TIME_LIMIT_S, log_path=log_path)


def run_steps_isolated(
    steps: Sequence[Step],
    settings: Settings,
    *,
    env: dict | None = None,
    timeout_s: float | None = None,
    device: str = "cuda",
    on_result: Callable[[Step, str, ProblemResult], None] | None = None,
    server: step_server.StepServer | None = None,
) -> list[dict[str, ProblemResult]]:
    """Run steps in a step server's child; results[i][candidate name] for every step and candidate, whatever happened.

    With `server`, its child (and its env and device) runs them and stays for the next call; else a server
    made for this call (env, device) and closed at the end. When the child dies or hangs, the step it was in
    is marked crash or timeout (a step of several candidates is first retried one candidate at a time, so
    only the one at fault is marked) and a fresh child goes on with the rest. `timeout_s`: per step.
    """
    if server is not None:
        return server.run_steps(steps, settings, on_result=on_result, timeout_s=timeout_s)
    with new_step_server(env=env, device=device) as own:
        return own.run_steps(steps, settings, on_result=on_result, timeout_s=timeout_s)


# ------------------------------------------------------------------------------------------------
# evaluate: one config over problems (in this process, or isolated).
# ------------------------------------------------------------------------------------------------


def _as_config(kind: str, config) -> ForwardConfig | BackwardConfig:
    """The config record of a direction, from the record or its dict."""
    if isinstance(config, dict):
        return (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(config)
    return config


def _configs_for(kind: str, config, experiment_module, pc) -> tuple[ForwardConfig, BackwardConfig]:
    """(forward, backward) configs of a run: `config` for its direction, the dispatch table's for the other."""
    config = _as_config(kind, config)
    if kind == "fwd":
        return config, experiment_module.backward_config(pc)
    return experiment_module.forward_config(pc), config


def feasibility_failure(direction: str, fwd_config: ForwardConfig, bwd_config: BackwardConfig, problem: Problem, target: Target) -> str:
    """'' when the target can run the configs on this problem, else the failing rule with its numbers."""
    verdict = check_forward_problem(fwd_config, problem, target)
    if not verdict:
        return f"forward config: {verdict}"
    if direction == "bwd":
        verdict = check_backward(bwd_config, problem.problem_class, target)
        if not verdict:
            return f"backward config: {verdict}"
    return ""


def _configs_checked(kind: str, config, experiment_module, problem: Problem, target: Target):
    """(forward config, backward config, an `infeasible` result or None) for one problem."""
    fwd_config, bwd_config = _configs_for(kind, config, experiment_module, problem.problem_class)
    failure = feasibility_failure(kind, fwd_config, bwd_config, problem, target)
    return fwd_config, bwd_config, ProblemResult(problem.label, kind, "infeasible", reason=failure) if failure else None


def _problems_for(kind: str, problems: Sequence[Problem]) -> list[Problem]:
    return [p for p in problems if kind == "fwd" or p.backward]


def _measurement(kind, config, problems, results, target, device_name, mode) -> Measurement:
    classes = {p.problem_class.name for p in problems}
    return Measurement(
        kind=kind, problem_class=classes.pop() if len(classes) == 1 else "suite", config=config.to_dict() if hasattr(config, "to_dict") else dict(config),
        results=tuple(results), target=target.name, device=device_name, mode=mode,
    )


def _device_and_mode(device, target: Target) -> tuple[str, str]:
    import torch

    if torch.device(device).type != "cuda":
        return "cpu", "cpu"
    info = gpu.read_device(torch.device(device).index or 0)
    return info.name, gpu.select_mode(info, target)


def evaluate(kind: str, config, problems: Sequence[Problem], experiment_module, *, target: Target | None = None,
             device=None, settings: Settings | None = None, timer=None) -> Measurement:
    """Gate and time one config (ForwardConfig for kind 'fwd', BackwardConfig for 'bwd', or its dict) on
    problems, in this process; the other direction's config comes from experiment_module's dispatch table."""
    import torch

    target = target or get_target()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = settings or Settings(gate_seed=new_gate_seed())
    device_name, mode = _device_and_mode(device, target)
    flusher = _make_flusher(device)
    results = []
    for problem in _problems_for(kind, problems):
        fwd_config, bwd_config, infeasible = _configs_checked(kind, config, experiment_module, problem, target)
        if infeasible:
            results.append(infeasible)
            continue
        candidate = experiment_candidate(experiment_module, fwd_config, bwd_config)
        try:
            step = measure_step(problem, kind, [candidate], device=device, settings=settings, timer=timer, flusher=flusher)
        except StepContextLost as lost:
            step = lost.results
        results.append(step[candidate.name])
    return _measurement(kind, _as_config(kind, config), _problems_for(kind, problems), results, target, device_name, mode)


def evaluate_isolated(kind: str, config, problems: Sequence[Problem], experiment_path: str | Path = EXPERIMENT_PATH, *,
                      target: Target | None = None, settings: Settings | None = None,
                      timeout_s: float | None = None, server: step_server.StepServer | None = None,
                      give_up_ms: dict[str, float] | None = None) -> Measurement:
    """evaluate() with every step in a step server's child (needs a GPU): crashes and hangs become results.
    `server`: one kept for the run (made with gpu.kernel_env), else a fresh one for this call. `give_up_ms`:
    per problem label, the median past which its timing stops (`pruned`)."""
    target = target or get_target()
    settings = settings or Settings(gate_seed=new_gate_seed())
    info = gpu.read_device()
    mode = gpu.select_mode(info, target)
    experiment_module = load_experiment(experiment_path)
    own = _as_config(kind, config)
    results: list[ProblemResult | None] = []
    steps: list[Step] = []
    for problem in _problems_for(kind, problems):
        fwd_config, bwd_config, infeasible = _configs_checked(kind, own, experiment_module, problem, target)
        results.append(infeasible)
        if infeasible:
            continue
        spec = experiment_spec(EXPERIMENT, experiment_path, fwd_config, bwd_config)
        steps.append(Step(problem, kind, [spec], (give_up_ms or {}).get(problem.label)))
    env = None if server is not None else gpu.kernel_env(info, target, mode)
    measured = iter(run_steps_isolated(steps, settings, env=env, timeout_s=timeout_s, server=server))
    results = [r if r is not None else next(measured)[EXPERIMENT] for r in results]
    return _measurement(kind, own, _problems_for(kind, problems), results, target, info.name, mode)


def new_gate_seed() -> int:
    """The seed of this run's random gate cases: $FA4TUNE_GATE_SEED, else drawn now (and recorded)."""
    fixed = os.environ.get("FA4TUNE_GATE_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**31)


# ------------------------------------------------------------------------------------------------
# Runs: the dispatch table over a suite, and the baselines.
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunContext:
    """Where a run happens: target, device and mode, and the tag every line carries."""

    target: Target
    device: gpu.DeviceInfo
    mode: str

    @property
    def label(self) -> str:
        return gpu.run_label(self.target, self.device.name, self.mode)


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def run_context(target_name: str | None = None) -> RunContext:
    """Target, device and mode of this machine; ConfigError (rule no_cuda / unsupported_device) otherwise."""
    import torch

    target = get_target(target_name)
    if not torch.cuda.is_available():
        raise ConfigError("no_cuda", "CUDA is not available: prepare.py times kernels on a GPU (for a static check without one: python experiment.py --static)")
    info = gpu.read_device()
    mode = gpu.select_mode(info, target)
    if mode == gpu.UNSUPPORTED:
        raise ConfigError("unsupported_device", f"{info.name} has compute capability {info.capability_text}; the SM120 kernels need 8.0 or newer to run emulated")
    return RunContext(target, info, mode)


def problem_error_line(label: str, direction: str, result: ProblemResult) -> str:
    """The one-line report of a problem that did not pass: 'fwd b1 s1024 h8 d256: infeasible: smem_capacity: ...'."""
    return f"{direction} {result.problem}: {result.status}: {result.reason} [{label}]"


def _progress(context: RunContext) -> Callable[[Step, str, ProblemResult], None]:
    def report(step: Step, name: str, result: ProblemResult) -> None:
        if result.status == "ok":
            print(
                f"{name} {step.direction} {step.problem.label}: ok {result.tflops:.1f} TFLOPS "
                f"(median {result.ms_median:.3f} ms) [{context.label}]", file=sys.stderr, flush=True,
            )
        else:
            _error(f"{name} " + problem_error_line(context.label, step.direction, result))

    return report


def _git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "experiment.py", "fa4tune"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + ("-dirty" if dirty else "")


def prepare_sha256() -> str:
    """Hash of this file: results.tsv rows say which harness measured them."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _header(context: RunContext, suite: str, problems: Sequence[Problem], settings: Settings, device: str) -> None:
    emulated = f" (SM120 kernels emulated on {context.device.name}, FLASH_ATTENTION_NUM_SMS={context.device.num_sms})" if context.mode == gpu.EMULATED else ""
    timer = "CUDA events, L2 flushed before each call" if device.startswith("cuda") else "wall clock"
    print(f"# run: {context.label}{emulated}", flush=True)
    print(f"# suite: {suite} ({len(problems)} problems); gate seed {settings.gate_seed}; "
          f"{settings.warmup} warm-up calls, then {settings.rounds} rounds x {settings.input_sets} input sets ({timer})", flush=True)


def _load_problems(suite: str, only: str | None) -> list[Problem]:
    problems = load_suite(suite)
    if only:
        chosen = [p for p in problems if only in p.label]
        if not chosen:
            raise ConfigError("problem_filter", f"no problem of suite {suite!r} has {only!r} in its name "
                                                f"(problems: {', '.join(p.label for p in problems)})")
        problems = chosen
    return problems


@dataclass
class Planned:
    """One (candidate, direction, problem) of a run: its config, and its result once known."""

    candidate: str
    direction: str
    index: int  # position of the problem in the suite
    problem: Problem
    config: dict
    result: ProblemResult | None = None  # set at planning when infeasible, else from the step that ran it


@dataclass
class Plan:
    """What a run will do: every planned outcome, and the steps (with their (direction, index) keys)."""

    planned: list[Planned]
    steps: list[Step]
    keys: list[tuple[str, int]]

    def add_step(self, direction: str, index: int, problem: Problem, specs: list[dict]) -> None:
        self.steps.append(Step(problem, direction, specs))
        self.keys.append((direction, index))

    def fill(self, steps_results: list[dict[str, ProblemResult]]) -> None:
        """Put step results into the planned outcomes (a planned outcome no step answered is a crash)."""
        found = {}
        for (direction, index), results in zip(self.keys, steps_results):
            for name, result in results.items():
                found[(name, direction, index)] = result
        for p in self.planned:
            if p.result is None:
                p.result = found.get((p.candidate, p.direction, p.index)) or ProblemResult(
                    p.problem.label, p.direction, "crash", reason="no result came back")

    def measurements(self, context: "RunContext") -> dict[str, list[Measurement]]:
        """Per candidate, one Measurement per (direction, problem class), in suite order."""
        groups: dict[tuple[str, str, str], list[Planned]] = {}
        for p in self.planned:
            groups.setdefault((p.candidate, p.direction, p.problem.problem_class.name), []).append(p)
        out: dict[str, list[Measurement]] = {}
        for (candidate, direction, _), members in groups.items():
            out.setdefault(candidate, []).append(_measurement(
                direction, members[0].config, [m.problem for m in members], [m.result for m in members],
                context.target, context.device.name, context.mode,
            ))
        return out


def _directions(problems: Sequence[Problem]) -> Iterator[tuple[str, int, Problem]]:
    """(direction, index, problem): every forward, then every backward that a problem has."""
    for direction in ("fwd", "bwd"):
        for index, problem in enumerate(problems):
            if direction == "fwd" or problem.backward:
                yield direction, index, problem


def plan_experiment(experiment_module, problems: Sequence[Problem], target: Target, experiment_path: str | Path) -> Plan:
    """The dispatch table's configs on every problem and direction; infeasible ones are decided here."""
    plan = Plan([], [], [])
    for direction, index, problem in _directions(problems):
        pc = problem.problem_class
        fwd_config, bwd_config = experiment_module.forward_config(pc), experiment_module.backward_config(pc)
        own = fwd_config if direction == "fwd" else bwd_config
        planned = Planned(EXPERIMENT, direction, index, problem, own.to_dict())
        failure = feasibility_failure(direction, fwd_config, bwd_config, problem, target)
        if failure:
            planned.result = ProblemResult(problem.label, direction, "infeasible", reason=failure)
        else:
            plan.add_step(direction, index, problem, [experiment_spec(EXPERIMENT, experiment_path, fwd_config, bwd_config)])
        plan.planned.append(planned)
    return plan


def plan_baseline(problems: Sequence[Problem], target: Target, experiment_path: str | Path) -> tuple[Plan, Plan]:
    """Two plans: upstream's SM120 defaults with torch SDPA (run together, emulated), and FA4's own path
    (run apart, with no arch override: upstream caches the arch it detects once per process)."""
    emulated, own_path = Plan([], [], []), Plan([], [], [])
    for direction, index, problem in _directions(problems):
        pc = problem.problem_class
        fwd_config, bwd_config = defaults.upstream_forward(pc), defaults.upstream_backward(pc)
        upstream = Planned(UPSTREAM_SM120, direction, index, problem, {"forward": fwd_config.to_dict(), "backward": bwd_config.to_dict()})
        specs = [{"name": TORCH_SDPA, "kind": TORCH_SDPA}]
        failure = feasibility_failure(direction, fwd_config, bwd_config, problem, target)
        if failure:
            upstream.result = ProblemResult(problem.label, direction, "infeasible", reason=failure)
        else:
            specs.insert(0, experiment_spec(UPSTREAM_SM120, experiment_path, fwd_config, bwd_config, kind=UPSTREAM_SM120))
        emulated.planned += [upstream, Planned(TORCH_SDPA, direction, index, problem, {"path": "torch.nn.functional.scaled_dot_product_attention"})]
        emulated.add_step(direction, index, problem, specs)
        own_path.planned.append(Planned(FA4_OWN_PATH, direction, index, problem, {"path": "flash_attn.cute.interface.flash_attn_func"}))
        own_path.add_step(direction, index, problem, [{"name": FA4_OWN_PATH, "kind": FA4_OWN_PATH}])
    return emulated, own_path


def _report_planned_failures(plan: Plan, context: "RunContext") -> None:
    for p in plan.planned:
        if p.result is not None:
            _error(f"{p.candidate} " + problem_error_line(context.label, p.direction, p.result))


def _begin(suite: str, only: str | None, context: "RunContext | None", settings: Settings | None, device: str):
    """(problems, context, settings, clocks at start) of a run, its header printed; ConfigError for bad
    input and for machines that cannot run the kernels."""
    problems = _load_problems(suite, only)
    context = context or run_context()
    settings = settings or Settings(gate_seed=new_gate_seed())
    _header(context, suite, problems, settings, device)
    return problems, context, settings, gpu.read_clocks(context.device.index)


def _print_clocks(start: gpu.Clocks, context: "RunContext") -> None:
    print(f"# clocks at start: {start.short()}; at end: {gpu.read_clocks(context.device.index).short()}", flush=True)


def run_experiment(experiment_module, suite: str = DEFAULT_SUITE, *, description: str = "", proposer: str | None = None,
                   results_path: str | Path = RESULTS_TSV, only: str | None = None, timeout_s: float = STEP_TIME_LIMIT_S,
                   context: "RunContext | None" = None, device: str = "cuda", settings: Settings | None = None) -> int:
    """Run experiment_module's dispatch table over a suite: table, metric lines, one results.tsv row.

    Returns 0 when every config passed, 1 when some did not, 2 for bad input or a broken guardrail (one
    line each on stderr). `context`, `device` and `settings` default to this GPU and the module constants."""
    changed = guards.harness_changes()
    refusals = [str(v) for v in guards.check_module(experiment_module)]
    refusals += [guards.harness_edit_error(changed)] if changed and not guards.harness_edit_allowed() else []
    for line in refusals:
        _error(line)
    if refusals:
        return 2
    if changed:
        description = f"{guards.harness_edit_mark(changed)} {description}".rstrip()
    try:
        problems, context, settings, clocks_start = _begin(suite, only, context, settings, device)
    except ConfigError as err:
        _error(str(err))
        return 2
    plan = plan_experiment(experiment_module, problems, context.target, Path(experiment_module.__file__).resolve())
    _report_planned_failures(plan, context)
    env = gpu.kernel_env(context.device, context.target, context.mode)
    plan.fill(run_steps_isolated(plan.steps, settings, env=env, timeout_s=timeout_s, device=device, on_result=_progress(context)))
    measurements = plan.measurements(context).get(EXPERIMENT, [])
    _print_clocks(clocks_start, context)
    summary = metrics.summarize(measurements, context.target, context.device.name, context.mode)
    metrics.print_table(metrics.problem_table(measurements, f"experiment.py per problem [{context.label}]"))
    for line in metrics.metric_lines(summary):
        print(line, flush=True)
    statuses = sorted({m.status for m in measurements if not m.ok})
    configs = {"fwd": {}, "bwd": {}}
    for m in measurements:
        configs[m.kind][m.problem_class] = m.config
    row = results_tsv.ResultRow(
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=_git_commit(),
        proposer=proposer or os.environ.get("FA4TUNE_PROPOSER", "manual"), target=context.target.name,
        device=context.device.name, mode=context.mode,
        fwd_tflops_geomean=summary.fwd_tflops_geomean, bwd_tflops_geomean=summary.bwd_tflops_geomean,
        fwd_tflops_peak=summary.fwd_tflops_peak, bwd_tflops_peak=summary.bwd_tflops_peak,
        peak_vram_mb=summary.peak_vram_mb, configs_ok=f"{summary.configs_ok}/{summary.configs_total}",
        status="ok" if not statuses else ",".join(statuses), prepare_sha256=prepare_sha256(), description=description,
        config={"suite": suite, "gate_seed": settings.gate_seed, "forward": configs["fwd"], "backward": configs["bwd"],
                "fwd_spread_pct": summary.fwd_spread_pct, "bwd_spread_pct": summary.bwd_spread_pct,  # (no new columns)
                **({"harness_edited": changed} if changed else {})},
    )
    results_tsv.append_row(results_path, row)
    return 0 if not statuses else 1


def run_baseline(suite: str = DEFAULT_SUITE, *, experiment_path: str | Path = EXPERIMENT_PATH, only: str | None = None,
                 timeout_s: float = STEP_TIME_LIMIT_S, context: "RunContext | None" = None, device: str = "cuda",
                 settings: Settings | None = None) -> int:
    """Time upstream's SM120 defaults (through experiment.attention), FA4's own path for this device and
    torch SDPA on a suite, per problem, with the same gate and timing; print them side by side."""
    try:
        problems, context, settings, clocks_start = _begin(suite, only, context, settings, device)
    except ConfigError as err:
        _error(str(err))
        return 2
    emulated, own_path = plan_baseline(problems, context.target, experiment_path)
    _report_planned_failures(emulated, context)
    progress = _progress(context)
    emulated.fill(run_steps_isolated(emulated.steps, settings, env=gpu.kernel_env(context.device, context.target, context.mode),
                                     timeout_s=timeout_s, device=device, on_result=progress))
    own_path.fill(run_steps_isolated(own_path.steps, settings, env=gpu.device_own_env(), timeout_s=timeout_s, device=device, on_result=progress))
    by_candidate = {**emulated.measurements(context), **own_path.measurements(context)}
    by_candidate = {name: by_candidate.get(name, []) for name in (UPSTREAM_SM120, FA4_OWN_PATH, TORCH_SDPA)}
    _print_clocks(clocks_start, context)
    for name, measurements in by_candidate.items():
        metrics.print_table(metrics.problem_table(measurements, f"{name} [{context.label}]"))
    metrics.print_table(metrics.comparison_table(by_candidate, f"baselines, TFLOPS per problem [{context.label}]"))
    for name, measurements in by_candidate.items():
        s = metrics.summarize(measurements, context.target, context.device.name, context.mode)
        print(
            f"baseline {name}: fwd_tflops_geomean {metrics.format_number(s.fwd_tflops_geomean)} "
            f"bwd_tflops_geomean {metrics.format_number(s.bwd_tflops_geomean)} fwd_tflops_peak "
            f"{metrics.format_number(s.fwd_tflops_peak)} bwd_tflops_peak {metrics.format_number(s.bwd_tflops_peak)} "
            f"configs_ok {s.configs_ok}/{s.configs_total} [{context.label}]", flush=True,
        )
    return 0 if all(m.ok for ms in by_candidate.values() for m in ms) else 1


# ------------------------------------------------------------------------------------------------
# Self-check on the GPU: the gate must catch what it claims to, and the timer's run-to-run spread.
# ------------------------------------------------------------------------------------------------

SELF_CHECK_PROBLEM = Problem(1, 2048, 2048, 16, 4, 128, 128, True, backward=True, name="self-check b1 s2048 hq16/hkv4 d128 causal")


def _planted_candidates() -> list[tuple[Candidate, bool]]:
    """(candidate, should pass): torch SDPA, and SDPA with planted faults the gate must catch."""
    import torch

    sdpa = sdpa_candidate()

    def unwritten(q, k, v, causal):
        # allocated after the gate poisoned the allocator; the kernel "forgets" to write it
        return torch.empty(q.shape[:3] + (v.shape[-1],), dtype=q.dtype, device=q.device), None

    def half_written(q, k, v, causal):
        out, _ = sdpa.forward(q, k, v, causal)
        partial = torch.empty_like(out)
        partial[:, : out.shape[1] // 2] = out[:, : out.shape[1] // 2]
        return partial, None

    def one_wrong(q, k, v, causal):
        out, _ = sdpa.forward(q, k, v, causal)
        out = out.clone()
        out[0, -1, 0, 0] += 0.25
        return out, None

    def one_nan(q, k, v, causal):
        out, _ = sdpa.forward(q, k, v, causal)
        out = out.clone()
        out[0, 0, -1, -1] = float("nan")
        return out, None

    def top_left_causal(q, k, v, causal):
        import torch.nn.functional as F

        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2), None

    return [
        (sdpa, True),
        (Candidate("unwritten output", unwritten, {}), False),
        (Candidate("half-written output", half_written, {}), False),
        (Candidate("one element +0.25", one_wrong, {}), False),
        (Candidate("one NaN", one_nan, {}), False),
        (Candidate("top-left causal (wrong when sq != sk)", top_left_causal, {}), False),
    ]


def run_self_check() -> int:
    """Show on this GPU that the gate passes a correct kernel and fails planted faults, and measure the
    run-to-run spread of timing one kernel as two candidates."""
    try:
        context = run_context()
    except ConfigError as err:
        _error(str(err))
        return 2
    settings = Settings(gate_seed=new_gate_seed())
    print(f"# self-check: {context.label}; gate seed {settings.gate_seed}", flush=True)
    problem = SELF_CHECK_PROBLEM
    surprises = 0
    for candidate, should_pass in _planted_candidates():
        for direction in ("fwd", "bwd") if candidate.name == TORCH_SDPA else ("fwd",):
            passed, _, reason = gate_candidate(candidate, problem, direction, "cuda", settings)
            verdict = "as expected" if passed == should_pass else "UNEXPECTED"
            surprises += passed != should_pass
            print(f"gate {direction} {candidate.name}: {'pass' if passed else 'fail'} ({verdict}) {reason} [{context.label}]", flush=True)
    # Time one kernel as two candidates, interleaved, in two separate runs: the medians' spread is the
    # noise floor, and the keep rule must not call either one an improvement on the other.
    sdpa = sdpa_candidate()
    twin = Candidate("torch sdpa (again)", sdpa.forward, {})
    flusher = _make_flusher("cuda")
    runs = []
    for run in range(2):
        seeds = [settings.gate_seed + 100 * (run + 1) + i for i in range(settings.input_sets)]
        calls = {c.name: _timed_calls(c, problem, "fwd", "cuda", seeds) for c in (sdpa, twin)}
        runs.append(timing.benchmark(calls, timer=timing.CudaEventTimer(), flush=flusher, rounds=settings.rounds, seed=settings.gate_seed + run))
    medians = [r[name].median_ms for r in runs for name in (sdpa.name, twin.name)]
    spread = (max(medians) - min(medians)) / min(medians) * 100
    claimed = timing.is_improvement([r[twin.name] for r in runs], [r[sdpa.name] for r in runs])
    print(
        f"timing one kernel as two candidates in two runs: medians {', '.join(f'{m:.4f}' for m in medians)} ms "
        f"({spread:.2f}% max-min); is_improvement says {claimed} (expected False) [{context.label}]", flush=True,
    )
    surprises += claimed
    print(f"self_check: {'ok' if not surprises else f'{surprises} unexpected'}", flush=True)
    return 0 if not surprises else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, with one line on stderr)."""
    args = _parser().parse_args(argv)
    if args.baseline:
        return run_baseline(args.suite, only=args.only, timeout_s=args.time_limit)
    if args.self_check:
        return run_self_check()
    path = Path(args.experiment)
    if not path.is_file():
        _error(f"experiment_file: {str(path)!r} does not exist")
        return 2
    return run_experiment(load_experiment(path), args.suite, description=args.description, only=args.only, timeout_s=args.time_limit)


if __name__ == "__main__":
    sys.exit(main())
