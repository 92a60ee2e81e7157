"""The replay evaluator: answers from a recorded table (search.evaluating.table), CPU only; the tests and the bench
search with it, and `search run --evaluator replay` tunes a table's problems without a GPU."""

from __future__ import annotations

import time
from dataclasses import replace

from fa4tune.config import Problem, ProblemClass
from fa4tune.harness.measurement import Measurement, ProblemResult
from search.evaluating.table import ReplayTable

MISSING = "missing"  # status of a replayed config that the table does not have


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
