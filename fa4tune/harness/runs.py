"""A run over a suite: where it happens (target, device, mode), its plan of steps, and the lines it prints.

prepare.run_experiment, fa4tune.harness.baselines and fa4tune.harness.self_check share these: the header, one
progress line per result, `error:` lines for what did not pass, the clocks at start and end, and what a results.tsv
row records about the code (the commit, prepare.py's sha256).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from fa4tune import emulated_occupancy
from fa4tune.config import ConfigError, Problem
from fa4tune.harness import gpu
from fa4tune.harness.evaluation import make_measurement
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.harness.settings import ROOT, Settings, new_gate_seed
from fa4tune.harness.steps import Step
from fa4tune.suites import load_suite
from fa4tune.targets import Target, get_target


@dataclass(frozen=True)
class RunContext:
    """Where a run happens: target, device and mode, and the tag every line carries."""

    target: Target
    device: gpu.DeviceInfo
    mode: str

    @property
    def label(self) -> str:
        return gpu.run_label(self.target, self.device.name, self.mode)


def error(message: str) -> None:
    """One `error:` line on stderr."""
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


def progress(context: RunContext) -> Callable[[Step, str, ProblemResult], None]:
    """The on_result callback of a run: one stderr line per result as it arrives."""

    def report(step: Step, name: str, result: ProblemResult) -> None:
        if result.status == "ok":
            print(
                f"{name} {step.direction} {step.problem.label}: ok {result.tflops:.1f} TFLOPS "
                f"(median {result.ms_median:.3f} ms) [{context.label}]", file=sys.stderr, flush=True,
            )
        else:
            error(f"{name} " + problem_error_line(context.label, step.direction, result))

    return report


def git_commit() -> str:
    """The short commit of the checkout, with `-dirty` when experiment.py or fa4tune/ differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "experiment.py", "fa4tune"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + ("-dirty" if dirty else "")


def prepare_sha256() -> str:
    """Hash of prepare.py: results.tsv rows say which harness measured them."""
    return hashlib.sha256((ROOT / "prepare.py").read_bytes()).hexdigest()


def _header(context: RunContext, suite: str, problems: Sequence[Problem], settings: Settings, device: str) -> None:
    emulated = (f" (SM120 kernels emulated on {context.device.name}, FLASH_ATTENTION_NUM_SMS={context.device.num_sms}, "
                f"{emulated_occupancy.describe(context.target.name)})" if context.mode == gpu.EMULATED else "")
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

    def measurements(self, context: RunContext) -> dict[str, list[Measurement]]:
        """Per candidate, one Measurement per (direction, problem class), in suite order."""
        groups: dict[tuple[str, str, str], list[Planned]] = {}
        for p in self.planned:
            groups.setdefault((p.candidate, p.direction, p.problem.problem_class.name), []).append(p)
        out: dict[str, list[Measurement]] = {}
        for (candidate, direction, _), members in groups.items():
            out.setdefault(candidate, []).append(make_measurement(
                direction, members[0].config, [m.problem for m in members], [m.result for m in members],
                context.target, context.device.name, context.mode,
            ))
        return out


def directions(problems: Sequence[Problem]) -> Iterator[tuple[str, int, Problem]]:
    """(direction, index, problem): every forward, then every backward that a problem has."""
    for direction in ("fwd", "bwd"):
        for index, problem in enumerate(problems):
            if direction == "fwd" or problem.backward:
                yield direction, index, problem


def report_planned_failures(plan: Plan, context: RunContext) -> None:
    """One `error:` line per outcome decided at planning (an infeasible config)."""
    for p in plan.planned:
        if p.result is not None:
            error(f"{p.candidate} " + problem_error_line(context.label, p.direction, p.result))


def begin(suite: str, only: str | None, context: RunContext | None, settings: Settings | None, device: str):
    """(problems, context, settings, clocks at start) of a run, its header printed; ConfigError for bad
    input and for machines that cannot run the kernels."""
    problems = _load_problems(suite, only)
    context = context or run_context()
    settings = settings or Settings(gate_seed=new_gate_seed())
    _header(context, suite, problems, settings, device)
    return problems, context, settings, gpu.read_clocks(context.device.index)


def print_clocks(start: gpu.Clocks, context: RunContext) -> None:
    """The `# clocks` line: the GPU's clocks at the run's start and now."""
    print(f"# clocks at start: {start.short()}; at end: {gpu.read_clocks(context.device.index).short()}", flush=True)
