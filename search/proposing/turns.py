"""Turn policies: who proposes the next trials, the sampler or a proposer (Claude, a script).

Turns are counted in trials used, so a proposer that enqueues k configs in one turn uses k shares.
"""

from __future__ import annotations

from fa4tune.config import ConfigError
from search.proposing.credit import recent_improvements
from search.storing.history import TrialRecord

NOT_COUNTED = ("baseline",)  # trials that belong to no proposer's share


class FixedRatio:
    """Each proposer gets trials in proportion to its weight, e.g. {"tpe": 1, "claude": 1}."""

    def __init__(self, weights: dict[str, float]):
        if not weights or any(w <= 0 for w in weights.values()):
            raise ConfigError("turn_ratio", f"turn weights must be positive, got {weights}")
        self.weights = dict(weights)

    def weight(self, name: str, history: list[TrialRecord]) -> float:
        return self.weights.get(name, 1.0)

    def counted(self, history: list[TrialRecord]) -> list[TrialRecord]:
        """The trials whose shares are compared (all of them)."""
        return history

    def next(self, history: list[TrialRecord], available: list[str]) -> str:
        """The available proposer furthest behind its share (ties: the order of the weights)."""
        used = {name: 0 for name in available}
        for r in self.counted(history):
            if r.is_search and r.proposer in used and r.proposer not in NOT_COUNTED:
                used[r.proposer] += 1
        order = [n for n in self.weights if n in available] + [n for n in available if n not in self.weights]
        return min(order, key=lambda n: (used[n] / self.weight(n, history), order.index(n)))

    def describe(self) -> str:
        return "fixed " + ":".join(f"{n}={w:g}" for n, w in self.weights.items())


class Adaptive(FixedRatio):
    """Shares over the last `window` trials, with weights multiplied by 1 + each proposer's improvements there."""

    def __init__(self, weights: dict[str, float], window: int = 10):
        super().__init__(weights)
        self.window = window

    def weight(self, name: str, history: list[TrialRecord]) -> float:
        return self.weights.get(name, 1.0) * (1 + recent_improvements(history, self.window).get(name, 0))

    def counted(self, history: list[TrialRecord]) -> list[TrialRecord]:
        # only the window: turns given for old improvements are not paid back later
        return [r for r in history if r.is_search][-self.window:]

    def describe(self) -> str:
        return f"adaptive (window {self.window}) " + ":".join(f"{n}={w:g}" for n, w in self.weights.items())


def parse_ratio(text: str, sampler: str, proposer: str) -> dict[str, float]:
    """'2:1' -> {sampler: 2, proposer: 1}; a one-line error for anything else."""
    try:
        a, b = (float(x) for x in text.split(":"))
        if a <= 0 or b <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError("turn_ratio", f"ratio must be SAMPLER:PROPOSER with positive numbers, e.g. 1:1, got {text!r}")
    return {sampler: a, proposer: b}


def make_policy(kind: str, weights: dict[str, float], window: int = 10) -> FixedRatio:
    """'fixed' or 'adaptive'."""
    if kind == "fixed":
        return FixedRatio(weights)
    if kind == "adaptive":
        return Adaptive(weights, window)
    raise ConfigError("turn_policy", f"policy must be fixed or adaptive, got {kind!r}")
