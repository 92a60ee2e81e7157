"""Evaluate: one config over problems, in this process or in a step server's child; steps run isolated.

The search's entry to the harness: `evaluate_isolated` (with `new_step_server` for a server kept over a run) gates
and times one config per call, the other direction's config from experiment.py's dispatch table; a config the
target cannot run is `infeasible` without running (`feasibility_failure`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from fa4tune.config import BackwardConfig, ForwardConfig, Problem
from fa4tune.feasibility import check_backward, check_forward_problem
from fa4tune.harness import gpu, step_server
from fa4tune.harness.candidates import EXPERIMENT, experiment_candidate, experiment_spec, load_experiment
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.harness.settings import EXPERIMENT_PATH, ROOT, STARTUP_TIME_LIMIT_S, STEP_TIME_LIMIT_S, Settings, new_gate_seed
from fa4tune.harness.steps import Step, StepContextLost, make_flusher, measure_step
from fa4tune.targets import Target, get_target


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


def _as_config(kind: str, config) -> ForwardConfig | BackwardConfig:
    """The config record of a direction, from the record or its dict."""
    if isinstance(config, dict):
        return (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(config)
    return config


def table_forward_config(experiment_module, problem: Problem) -> ForwardConfig:
    """The dispatch table's forward config for a problem: a packed one's is the varlen entry's (fa4tune.api's rule;
    an experiment.py without `varlen_forward_config` runs its plain entry, refused by varlen_kernel where it cannot)."""
    pc = problem.problem_class
    if problem.lengths:
        return getattr(experiment_module, "varlen_forward_config", experiment_module.forward_config)(pc)
    return experiment_module.forward_config(pc)


def _configs_for(kind: str, config, experiment_module, problem: Problem) -> tuple[ForwardConfig, BackwardConfig]:
    """(forward, backward) configs of a run: `config` for its direction, the dispatch table's for the other."""
    config = _as_config(kind, config)
    if kind == "fwd":
        return config, experiment_module.backward_config(problem.problem_class)
    return table_forward_config(experiment_module, problem), config


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
    fwd_config, bwd_config = _configs_for(kind, config, experiment_module, problem)
    failure = feasibility_failure(kind, fwd_config, bwd_config, problem, target)
    return fwd_config, bwd_config, ProblemResult(problem.label, kind, "infeasible", reason=failure) if failure else None


def _problems_for(kind: str, problems: Sequence[Problem]) -> list[Problem]:
    return [p for p in problems if kind == "fwd" or p.backward]


def make_measurement(kind, config, problems, results, target, device_name, mode) -> Measurement:
    """The Measurement of one config (a record or its dict) over problems of one class (else class "suite")."""
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
    flusher = make_flusher(device)
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
    return make_measurement(kind, _as_config(kind, config), _problems_for(kind, problems), results, target, device_name, mode)


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
    return make_measurement(kind, own, _problems_for(kind, problems), results, target, info.name, mode)
