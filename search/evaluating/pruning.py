"""Stopping hopeless configs early, through Optuna's pruning API.

Two places, one rule ("clearly slower than the study's best"):
- inside a problem's timing: the evaluator passes the harness a give-up time per problem (the study's best
  time on that problem times `factor`); a candidate whose first timed round is slower stops timing and is
  recorded `pruned` with what was measured (fa4tune.harness.steps.measure_step). The gate always runs first.
- between problems: after each problem the trial reports the geometric mean of its TFLOPS so far
  (`trial.report(value, step=problem index)`), and `SlowerThanBestPruner` prunes it when that value is below
  the best finished trial's value at the same step divided by `factor`; its other problems are not measured.

How pruned trials reach the sampler: they are told as `TrialState.PRUNED` with their intermediate values and a
feasibility constraint of 0. TPE ranks pruned trials after every complete trial (by the step they reached,
then their last intermediate value), so they land in its "bad" group and steer it away; GP and random
sampling ignore pruned trials. A pruned config counts as evaluated (it is never measured again).
"""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from fa4tune.config import Problem
from fa4tune.harness import flops
from fa4tune.harness.measurement import ProblemResult

DEFAULT_FACTOR = 1.3  # "clearly slower": 30 % behind the best, far beyond run-to-run noise (< 3 %)
PRUNED = "pruned"


class SlowerThanBestPruner(optuna.pruners.BasePruner):
    """Prunes a trial whose intermediate value at its last step is below best-at-that-step / factor."""

    def __init__(self, factor: float = DEFAULT_FACTOR):
        if not factor or factor <= 1.0:
            raise ValueError(f"the pruning factor must be > 1, got {factor!r}")
        self.factor = factor

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        others = [t.intermediate_values.get(step) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        others = [v for v in others if v is not None and math.isfinite(v) and v > 0]
        return bool(others) and value * self.factor < max(others)


def make_pruner(factor: float) -> optuna.pruners.BasePruner:
    """The study's pruner: SlowerThanBestPruner, or Optuna's NopPruner when factor is 0 (pruning off)."""
    return optuna.pruners.NopPruner() if not factor else SlowerThanBestPruner(factor)


def best_tflops(results_of_trials: list[list[dict]]) -> dict[str, float]:
    """Per problem label, the highest TFLOPS among ok results (ProblemResult dicts of finished trials)."""
    best: dict[str, float] = {}
    for results in results_of_trials:
        for r in results:
            if r.get("status") == "ok" and r.get("tflops"):
                best[r["problem"]] = max(best.get(r["problem"], 0.0), r["tflops"])
    return best


def give_up_ms(problems: list[Problem], direction: str, best: dict[str, float], factor: float) -> dict[str, float]:
    """Per problem label, the time above which a candidate is clearly slower than the study's best."""
    if not factor:
        return {}
    limits = {}
    for p in problems:
        if best.get(p.label):
            limits[p.label] = flops.problem_flops(p, direction) / (best[p.label] / factor) / 1e9
    return limits


class TrialMonitor:
    """What an evaluator tells a trial while it measures one config: a give-up time per problem, and each
    problem's result, reported to Optuna; `report` returns False once the trial should stop."""

    def __init__(self, trial: optuna.Trial, limits: dict[str, float]):
        self.trial = trial
        self.limits = limits
        self._tflops: list[float] = []
        self.pruned = False

    def give_up_ms(self, label: str) -> float | None:
        return self.limits.get(label)

    def report(self, result: ProblemResult) -> bool:
        """Reports the running geomean after this problem; False when the config is pruned (stop measuring)."""
        if result.status not in ("ok", PRUNED) or not result.tflops:
            return True  # a failure ends the trial by itself; nothing to compare
        self._tflops.append(result.tflops)
        value = math.exp(sum(math.log(t) for t in self._tflops) / len(self._tflops))
        self.trial.report(value, step=len(self._tflops) - 1)
        self.pruned = self.pruned or result.status == PRUNED or self.trial.should_prune()
        return not self.pruned


def not_measured(problem: Problem, direction: str, why: str) -> ProblemResult:
    """The result of a problem left out because the config was pruned on an earlier one."""
    return ProblemResult(problem.label, direction, PRUNED, reason=f"not measured: {why}")
