"""Evaluators: turn a feasible config into a Measurement. The search sees only this interface.

`ReplayEvaluator` answers from a recorded table (CPU only; tests and the bench), `GpuEvaluator`
calls the harness (fa4tune.harness.evaluation: correctness gate, then timing, in an isolated process).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from fa4tune.config import ConfigError, Problem, ProblemClass
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.targets import Target
from search.pruning import not_measured
from search.table import ReplayTable, load_table

MISSING = "missing"  # status of a replayed config that the table does not have
STATIC_TIMEOUT_S = 180.0  # one sm_120a compile; a hung one must not hold the trial longer
STATIC_ENDS = ("infeasible", "compile_error")  # static statuses that keep a config off the GPU
AUTO = -1  # --compile-jobs default: every core but one
EVALUATORS = ("gpu", "replay")


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
    from search.gpu_pipeline import PipelinedGpuEvaluator  # torch, CUDA and the kernels only where a GPU is used

    return PipelinedGpuEvaluator(target, jobs)


class Evaluator(Protocol):
    """Measures one config on the problems of one problem class."""

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem], monitor=None) -> Measurement:
        """`monitor` (search.pruning.TrialMonitor, optional): a give-up time per problem, and each result reported
        as it comes; when `monitor.report` returns False the config's other problems are not measured."""


class ReplayEvaluator:
    """Answers from a recorded table; a config the table lacks gets status 'missing' ("missing from table").

    `delay_s` sleeps before each answer, so that a replayed study lasts long enough to be interrupted.
    """

    slots = 1  # trials in flight a run gives it (answers are instant; --slots can raise it)

    def __init__(self, table: ReplayTable, delay_s: float = 0.0):
        self.table = table
        self.delay_s = delay_s
        self.calls: list[tuple[str, str, dict]] = []  # (kind, problem class, config): what reached the evaluator

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem], monitor=None) -> Measurement:
        """The recorded results of `problems` (all recorded problems of the class when empty); a replayed answer
        costs nothing, so the monitor is not asked to prune it."""
        self.calls.append((kind, problem_class.name, config.to_dict()))
        if self.delay_s:
            time.sleep(self.delay_s)
        recorded = self.table.lookup(kind, problem_class.name, config)
        labels = [p.label for p in problems]
        if recorded is None:
            results = tuple(self._missing(label, kind, "config") for label in labels or ["(all problems)"])
            return self._measurement(kind, problem_class, config, results, recorded)
        by_label = {r.problem: r for r in recorded.results}
        whole = by_label.get("")  # a result for the config as a whole (e.g. the sweep died on it)
        if not labels:
            results = recorded.results
        else:
            results = tuple(by_label.get(label) or (replace(whole, problem=label) if whole else self._missing(label, kind, "problem"))
                            for label in labels)
        return self._measurement(kind, problem_class, config, results, recorded)

    def _missing(self, label: str, kind: str, what: str) -> ProblemResult:
        return ProblemResult(label, kind, MISSING, reason=f"{what} missing from table {self.table.name}")

    def _measurement(self, kind, problem_class, config, results, recorded: Measurement | None) -> Measurement:
        device = self.table.meta.get("device") or (recorded.device if recorded else "")
        return Measurement(
            kind=kind, problem_class=problem_class.name, config=config.to_dict(), results=results,
            target=self.table.meta.get("target") or (recorded.target if recorded else ""),
            device=f"{device} (replayed from {self.table.name})", mode="replay", evaluator="replay",
            static=dict(recorded.static) if recorded else {},
        )


def not_run(kind: str, problems: list[Problem], compiled: dict) -> tuple[ProblemResult, ...]:
    """Every problem's result of a config the compile stage ended (compile_error or infeasible): no GPU time."""
    return tuple(ProblemResult(p.label, kind, compiled["status"], reason=compiled.get("reason", "")) for p in problems)


class GpuEvaluator:
    """The harness on the local GPU, one config at a time: gate, then timing, in the run's step server (one child
    process for the whole run: it keeps its CUDA context, its imports and the gate's fp32 references; a config that
    faults or hangs costs its step and a fresh child, not the study).

    First the config's kernel is compiled for sm_120a on the CPU (fa4tune.static_check; cached, so a config
    compiles once per problem class): every trial records SM120's exact registers, spills and shared memory,
    whatever GPU times it, and a kernel whose compiled shared storage exceeds the target's 99 KB, or that does not
    compile, never reaches the GPU. The problems are measured one at a time, each reported to the trial's monitor
    (search.pruning), so a pruned config leaves its other problems unmeasured. The other direction's config comes
    from experiment.py's dispatch table. (`search run`'s default is the pipelined evaluator, which compiles ahead.)
    """

    slots = 1  # one trial at a time: it compiles on the GPU's turn
    compile_jobs = 0

    def __init__(self, target: Target, experiment_path: str | None = None, static_timeout_s: float = STATIC_TIMEOUT_S,
                 static_cache: Path | None = None, settings=None):
        # Imported here, not at module level: torch, CUDA and the kernels only where a GPU is used.
        from fa4tune.harness import evaluation
        from fa4tune.harness.runs import prepare_sha256
        from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed

        self._harness = evaluation
        self.experiment_path = experiment_path or EXPERIMENT_PATH
        self.target = target
        self.harness_sha256 = prepare_sha256()
        self.static_timeout_s = static_timeout_s
        self.static_cache = static_cache  # None: the static check's own (.cache/static-facts.jsonl)
        # one gate seed for the run, so that the server's child computes each problem's references once
        self.settings = settings or Settings(gate_seed=new_gate_seed())
        self._checker = None  # fa4tune.static_check.StaticChecker, its compile worker kept between trials
        self._checker_lock = threading.Lock()  # a worker with --slots N evaluates from N threads; the checker is not shared
        self._server = None  # fa4tune.harness.step_server.StepServer, started on the first GPU step

    @property
    def server(self):
        """The run's step server (started when first needed)."""
        with self._checker_lock:
            if self._server is None:
                self._server = self._harness.new_step_server(target=self.target)
            return self._server

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem], monitor=None) -> Measurement:
        """The config's sm_120a static facts, then (unless they end it) each problem through the harness in turn."""
        problems = [p for p in problems if kind == "fwd" or p.backward]
        static = self.static_facts(kind, config, problem_class)
        if static["status"] in STATIC_ENDS:
            return Measurement(kind, problem_class.name, config.to_dict(), not_run(kind, problems, static), self.target.name,
                               "", "", evaluator="gpu", static=static)
        results, m = [], Measurement(kind, problem_class.name, config.to_dict(), (), self.target.name, "", "", evaluator="gpu")
        for i, problem in enumerate(problems):
            limit = monitor.give_up_ms(problem.label) if monitor else None
            m = self._harness.evaluate_isolated(kind, config, [problem], self.experiment_path, target=self.target, settings=self.settings,
                                                server=self.server, give_up_ms={problem.label: limit} if limit else None)
            results.append(m.results[0])
            if monitor is not None and not monitor.report(m.results[0]):
                results += [not_measured(p, kind, f"the config was pruned on {problem.label}") for p in problems[i + 1:]]
                break
        return replace(m, problem_class=problem_class.name, results=tuple(results), static={**m.static, **static})

    def static_facts(self, kind: str, config, problem_class: ProblemClass) -> dict:
        """StaticFacts.to_dict() of the sm_120a compile, with "arch"; status "static_error" if the check itself broke."""
        from fa4tune.static_check import DEFAULT_CACHE, StaticChecker, StaticJob

        try:
            with self._checker_lock:
                if self._checker is None:
                    self._checker = StaticChecker(self.target, self.experiment_path, workers=1, timeout_s=self.static_timeout_s,
                                                  cache_path=self.static_cache or DEFAULT_CACHE)
                facts = self._checker.check([StaticJob(kind, config, problem_class)])[0]
        except Exception as err:  # the GPU measurement goes on without static facts
            return {"status": "static_error", "reason": f"{type(err).__name__}: {err}"[:500], "arch": "sm_120a"}
        return {**facts.to_dict(), "arch": "sm_120a"}

    def close(self) -> None:
        """Ends the static check's compile worker and the step server."""
        with self._checker_lock:
            if self._checker is not None:
                self._checker.close()
                self._checker = None
            if self._server is not None:
                self._server.close()
                self._server = None
