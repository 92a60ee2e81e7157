"""Credit per proposer: who used trials, who found the improvements, who holds the best."""

from __future__ import annotations

from dataclasses import dataclass

from search.storing.history import TrialRecord


@dataclass
class Credit:
    """What one proposer did in one study."""

    proposer: str
    trials: int = 0  # search trials it made (infeasible and duplicates included)
    evaluated: int = 0  # of those, configs that reached the evaluator
    infeasible: int = 0
    improvements: int = 0  # evaluated trials that beat the best so far when they finished
    best: float | None = None  # its best geomean TFLOPS
    holds_best: bool = False  # it found the study's best


def credit(history: list[TrialRecord]) -> dict[str, Credit]:
    """Credit per proposer over a study's search trials, in trial order."""
    credits: dict[str, Credit] = {}
    best_so_far, holder = None, None
    for r in sorted(history, key=lambda r: r.number):
        if not r.is_search:
            continue
        c = credits.setdefault(r.proposer, Credit(r.proposer))
        c.trials += 1
        c.evaluated += r.evaluated
        c.infeasible += r.status == "infeasible"
        if r.evaluated and r.ok:
            if best_so_far is None or r.value > best_so_far:
                c.improvements += 1
                best_so_far, holder = r.value, r.proposer
            c.best = r.value if c.best is None else max(c.best, r.value)
    if holder is not None:
        credits[holder].holds_best = True
    return credits


def recent_improvements(history: list[TrialRecord], window: int) -> dict[str, int]:
    """Improvements per proposer among the last `window` search trials (for the adaptive turn policy)."""
    search = [r for r in sorted(history, key=lambda r: r.number) if r.is_search]
    counts: dict[str, int] = {}
    best_so_far = None
    for i, r in enumerate(search):
        if r.evaluated and r.ok and (best_so_far is None or r.value > best_so_far):
            best_so_far = r.value
            if i >= len(search) - window:
                counts[r.proposer] = counts.get(r.proposer, 0) + 1
    return counts
