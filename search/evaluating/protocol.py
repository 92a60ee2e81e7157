"""What the search sees of an evaluator (the `Evaluator` protocol: a feasible config in, a Measurement out), and the
one factory that makes the evaluator a run names: the replay of a recorded table (search.evaluating.replay, CPU
only) or the GPU harness (search.evaluating.gpu, search.evaluating.gpu_pipeline).
"""

from __future__ import annotations

import os
from typing import Protocol

from fa4tune.config import ConfigError, Problem, ProblemClass
from fa4tune.harness.measurement import Measurement
from fa4tune.targets import Target
from search.evaluating.gpu import GpuEvaluator
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import load_table

AUTO = -1  # --compile-jobs default: every core but one
EVALUATORS = ("gpu", "replay")


class Evaluator(Protocol):
    """Measures one config on the problems of one problem class."""

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem], monitor=None) -> Measurement:
        """`monitor` (search.evaluating.pruning.TrialMonitor, optional): a give-up time per problem, and each result
        reported as it comes; when `monitor.report` returns False the config's other problems are not measured."""


def occupancy_of(evaluator) -> str:
    """The CTAs per SM an evaluator's emulated measurements run at (fa4tune.emulated_occupancy.regime()), or ''
    where it does not measure in emulation (SM120 itself, a replay, no GPU)."""
    if getattr(evaluator, "mode", "") != "emulated":
        return ""
    from fa4tune import emulated_occupancy

    return emulated_occupancy.regime()


def default_compile_jobs(workers: int = 1) -> int:
    """CPU compile processes per worker by default: the machine's cores but one, shared by its workers."""
    return max(1, ((os.cpu_count() or 2) - 1) // max(1, workers))


def make_evaluator(name: str, target: Target | None, *, table: str = "", replay_delay: float = 0.0, compile_jobs: int = AUTO):
    """The one evaluator factory of `search run` and `search worker`: the replay of a recorded table, or the GPU
    harness, compiling ahead in `compile_jobs` CPU processes (AUTO: default_compile_jobs(); 0: no compile-ahead,
    each config compiled on the GPU's turn)."""
    if name == "replay":
        if not table:
            raise ConfigError("table_file", "the replay evaluator needs --table PATH")
        return ReplayEvaluator(load_table(table), delay_s=replay_delay)
    if name != "gpu":
        raise ConfigError("evaluator", f"evaluator must be one of {', '.join(EVALUATORS)}, got {name!r}")
    if compile_jobs < AUTO:
        raise ConfigError("compile_jobs", f"--compile-jobs must be >= 0 (or -1 for every core but one), got {compile_jobs}")
    try:
        import torch
    except ImportError as err:
        raise ConfigError("gpu_evaluator", f"the gpu evaluator needs torch importable: {err}")
    if not torch.cuda.is_available():
        raise ConfigError("gpu_evaluator", "no CUDA GPU here: use --evaluator replay --table PATH")
    jobs = default_compile_jobs() if compile_jobs == AUTO else compile_jobs
    if jobs == 0:
        return GpuEvaluator(target)
    from search.evaluating.gpu_pipeline import PipelinedGpuEvaluator  # torch, CUDA and the kernels only where a GPU is used

    return PipelinedGpuEvaluator(target, jobs)
