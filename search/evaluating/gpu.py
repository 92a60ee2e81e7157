"""The GPU evaluator, one config at a time: the harness (fa4tune.harness.evaluation: correctness gate, then timing,
in an isolated process) after the config's sm_120a static check. `search run`'s default, which compiles ahead, is
search.evaluating.gpu_pipeline; this module also holds what both share (STATIC_ENDS, not_run).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import replace
from pathlib import Path

from fa4tune.config import Problem, ProblemClass
from fa4tune.harness.measurement import Measurement, ProblemResult
from fa4tune.targets import Target
from search.evaluating.pruning import not_measured

STATIC_TIMEOUT_S = 180.0  # one sm_120a compile; a hung one must not hold the trial longer
STATIC_ENDS = ("infeasible", "compile_error")  # static statuses that keep a config off the GPU


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
    (search.evaluating.pruning), so a pruned config leaves its other problems unmeasured. The other direction's config comes
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

    @functools.cached_property
    def mode(self) -> str:
        """'native' or 'emulated' on this machine's GPU ('' without one): what its measurements will say."""
        import torch

        if not torch.cuda.is_available():
            return ""
        from fa4tune.harness import gpu

        return gpu.select_mode(gpu.read_device(), self.target)

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
