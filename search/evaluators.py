"""Evaluators: turn a feasible config into a Measurement. The search sees only this interface.

`ReplayEvaluator` answers from a recorded table (CPU only; tests and the bench), `GpuEvaluator`
calls the harness (prepare.evaluate: correctness gate, then timing, in an isolated process).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from fa4tune.config import Problem, ProblemClass
from fa4tune.measurement import Measurement, ProblemResult
from fa4tune.targets import Target
from search.table import ReplayTable

MISSING = "missing"  # status of a replayed config that the table does not have


class Evaluator(Protocol):
    """Measures one config on the problems of one problem class."""

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem]) -> Measurement: ...


class ReplayEvaluator:
    """Answers from a recorded table; a config the table lacks gets status 'missing' ("missing from table").

    `delay_s` sleeps before each answer, so that a replayed study lasts long enough to be interrupted.
    """

    def __init__(self, table: ReplayTable, delay_s: float = 0.0):
        self.table = table
        self.delay_s = delay_s
        self.calls: list[tuple[str, str, dict]] = []  # (kind, problem class, config): what reached the evaluator

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem]) -> Measurement:
        """The recorded results of `problems` (all recorded problems of the class when empty)."""
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


class GpuEvaluator:
    """The harness on the local GPU: gate, then timing, each step in a child process (prepare.evaluate_isolated).

    A config that faults or hangs costs its step, not the study. The other direction's config comes
    from experiment.py's dispatch table.
    """

    def __init__(self, target: Target, experiment_path: str | None = None):
        # Imported here, not at module level: torch, CUDA and the kernels only where a GPU is used.
        import prepare

        self._prepare = prepare
        self.experiment_path = experiment_path or prepare.EXPERIMENT_PATH
        self.target = target
        self.harness_sha256 = prepare.prepare_sha256()

    def evaluate(self, kind: str, config, problem_class: ProblemClass, problems: list[Problem]) -> Measurement:
        """One harness evaluation of a config on the problems of its class."""
        return self._prepare.evaluate_isolated(kind, config, problems, self.experiment_path, target=self.target)
