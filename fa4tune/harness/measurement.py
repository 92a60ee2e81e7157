"""Measurements: the frozen record one evaluation produces, whoever produced it (GPU or replay).

Data flows one way: Config -> feasibility -> compile (StaticFacts) -> evaluate -> Measurement ->
store (Optuna storage + results.tsv row) -> proposers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

STATUSES = ("ok", "incorrect", "crash", "timeout", "infeasible", "compile_error", "unsupported", "guard", "pruned")


@dataclass(frozen=True)
class ProblemResult:
    """One problem of a suite, one direction, under one config."""

    problem: str  # Problem.label
    direction: str  # "fwd" | "bwd"
    status: str  # one of STATUSES
    tflops: float | None = None
    ms_median: float | None = None
    ms_min: float | None = None
    ms_max: float | None = None
    max_errors: dict = field(default_factory=dict)  # e.g. {"out": 1e-3, "lse": 2e-5, "out_tolerance": 4e-3}
    reason: str = ""
    peak_vram_mb: float | None = None
    ms_q1: float | None = None  # quartiles of the timed calls: their IQR is the spread the keep rule uses
    ms_q3: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ProblemResult":
        return cls(**data)


@dataclass(frozen=True)
class Measurement:
    """A config evaluated on the problems of one problem class (or a whole suite)."""

    kind: str  # "fwd" | "bwd"
    problem_class: str  # ProblemClass.name, or "suite" for a whole-suite run
    config: dict
    results: tuple[ProblemResult, ...]
    target: str
    device: str
    mode: str  # "native" | "emulated" | "replay" | "static"
    evaluator: str = "gpu"
    static: dict = field(default_factory=dict)  # StaticFacts.to_dict() when known

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.status == "ok" for r in self.results)

    @property
    def status(self) -> str:
        """'ok', or the first non-ok status among the results."""
        for r in self.results:
            if r.status != "ok":
                return r.status
        return "ok" if self.results else "crash"

    @property
    def reason(self) -> str:
        return next((r.reason for r in self.results if r.status != "ok"), "")

    def geomean_tflops(self) -> float | None:
        """Geometric mean TFLOPS over the problems, or None unless every problem is ok."""
        if not self.ok:
            return None
        return geomean([r.tflops for r in self.results])

    def to_dict(self) -> dict:
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Measurement":
        data = dict(data)
        data["results"] = tuple(ProblemResult.from_dict(r) for r in data["results"])
        return cls(**data)


def geomean(values) -> float:
    """Geometric mean of positive numbers."""
    values = list(values)
    if not values or any(v is None or v <= 0 for v in values):
        raise ValueError(f"geomean needs positive numbers, got {values}")
    return math.exp(sum(math.log(v) for v in values) / len(values))
