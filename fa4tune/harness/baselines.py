"""Baselines (`prepare.py --baseline`): upstream's SM120 defaults, FA4's own path for this GPU and torch SDPA on a
suite, with the same gate and timing as experiment.py's runs, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fa4tune import defaults
from fa4tune.config import ConfigError, Problem
from fa4tune.harness import gpu, metrics
from fa4tune.harness.candidates import FA4_OWN_PATH, TORCH_SDPA, UPSTREAM_SM120, experiment_spec
from fa4tune.harness.evaluation import feasibility_failure, run_steps_isolated
from fa4tune.harness.measurement import ProblemResult
from fa4tune.harness.runs import Plan, Planned, RunContext, begin, directions, error, print_clocks, progress, report_planned_failures
from fa4tune.harness.settings import DEFAULT_SUITE, EXPERIMENT_PATH, STEP_TIME_LIMIT_S, Settings
from fa4tune.targets import Target


def plan_baseline(problems: Sequence[Problem], target: Target, experiment_path: str | Path) -> tuple[Plan, Plan]:
    """Two plans: upstream's SM120 defaults with torch SDPA (run together, emulated), and FA4's own path
    (run apart, with no arch override: upstream caches the arch it detects once per process)."""
    emulated, own_path = Plan([], [], []), Plan([], [], [])
    for direction, index, problem in directions(problems):
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


def run_baseline(suite: str = DEFAULT_SUITE, *, experiment_path: str | Path = EXPERIMENT_PATH, only: str | None = None,
                 timeout_s: float = STEP_TIME_LIMIT_S, context: RunContext | None = None, device: str = "cuda",
                 settings: Settings | None = None) -> int:
    """Time upstream's SM120 defaults (through experiment.attention), FA4's own path for this device and
    torch SDPA on a suite, per problem, with the same gate and timing; print them side by side."""
    try:
        problems, context, settings, clocks_start = begin(suite, only, context, settings, device)
    except ConfigError as err:
        error(str(err))
        return 2
    emulated, own_path = plan_baseline(problems, context.target, experiment_path)
    report_planned_failures(emulated, context)
    on_result = progress(context)
    emulated.fill(run_steps_isolated(emulated.steps, settings, env=gpu.kernel_env(context.device, context.target, context.mode),
                                     timeout_s=timeout_s, device=device, on_result=on_result))
    own_path.fill(run_steps_isolated(own_path.steps, settings, env=gpu.device_own_env(), timeout_s=timeout_s, device=device, on_result=on_result))
    by_candidate = {**emulated.measurements(context), **own_path.measurements(context)}
    by_candidate = {name: by_candidate.get(name, []) for name in (UPSTREAM_SM120, FA4_OWN_PATH, TORCH_SDPA)}
    print_clocks(clocks_start, context)
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
