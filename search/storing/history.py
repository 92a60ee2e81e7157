"""A study's trials as plain records (what proposers, the report, credit and apply read).

A trial's measurement is read from its `measurement` attribute, or, for a storage written before that attribute
existed, from the separate attributes that held its parts (search.storing.schema: LEGACY_TRIAL_ATTRS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from optuna.trial import FrozenTrial, TrialState

from fa4tune.config import ForwardConfig
from fa4tune.harness.measurement import ProblemResult
from search.storing import schema

FINISHED = ("COMPLETE", "PRUNED")  # trial states of a finished search trial
DEFAULT_KERNEL = ForwardConfig().kernel  # short_config leaves it out


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the search sees it (read back from the storage)."""

    number: int
    state: str  # TrialState name: COMPLETE, FAIL, RUNNING, WAITING
    proposer: str
    config: dict
    status: str
    value: float | None  # geomean TFLOPS when ok
    reason: str = ""
    rule: str = ""
    tflops: dict = field(default_factory=dict)
    static: dict = field(default_factory=dict)  # the measurement's static facts (registers, spills, smem), if any
    rationale: str = ""
    evaluated: bool = False
    evaluator: str = ""  # the measurement's evaluator: "gpu", "replay" ("" when not evaluated)
    confirmation_of: int | None = None
    confirmed: bool | None = None
    duplicate_of: int | None = None
    intermediate: dict = field(default_factory=dict)  # {step: value} reported while measuring (search.evaluating.pruning)
    results: tuple[ProblemResult, ...] = ()  # the measurement's per-problem results: times, the gate's errors, reasons

    @property
    def is_search(self) -> bool:
        """A trial of the search itself (not a confirmation), finished (complete, or pruned while measuring)."""
        return self.state in FINISHED and self.confirmation_of is None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.value is not None


def stored_measurement(a: dict) -> dict:
    """A trial's Measurement.to_dict() from its user attrs `a`: the `measurement` attribute, or in a storage written
    before it existed, what the separate attributes held (results, static, evaluator, device, mode); {} for a trial
    whose config never reached an evaluator (infeasible, a duplicate)."""
    if schema.MEASUREMENT in a:
        return a[schema.MEASUREMENT] or {}
    if not any(name in a for name in schema.LEGACY_TRIAL_ATTRS):
        return {}
    return {"config": a.get(schema.CONFIG) or {}, "results": a.get(schema.RESULTS) or [], "target": a.get(schema.TARGET, ""),
            "device": a.get(schema.DEVICE, ""), "mode": a.get(schema.MODE, ""), "evaluator": a.get(schema.EVALUATOR, ""),
            "static": a.get(schema.STATIC) or {}}


_RESULT_FIELDS = {f.name for f in fields(ProblemResult)}


def _result(data: dict) -> ProblemResult:
    # a field an older version stored and this one dropped is left out, so that old storages still read
    return ProblemResult(**{k: v for k, v in data.items() if k in _RESULT_FIELDS})


def record(trial: FrozenTrial) -> TrialRecord:
    """The record of one Optuna trial."""
    a = trial.user_attrs
    m = stored_measurement(a)
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        proposer=a.get(schema.PROPOSER, ""),
        config=a.get(schema.CONFIG) or dict(trial.params),
        status=a.get(schema.STATUS, "" if trial.state != TrialState.FAIL else "failed"),
        value=a.get(schema.GEOMEAN_TFLOPS),
        reason=a.get(schema.REASON, ""),
        rule=a.get(schema.RULE, ""),
        tflops=a.get(schema.TFLOPS) or {},
        static=m.get("static") or {},
        rationale=a.get(schema.RATIONALE, ""),
        evaluated=bool(a.get(schema.EVALUATED)),
        evaluator=m.get("evaluator", ""),
        confirmation_of=a.get(schema.CONFIRMATION_OF),
        confirmed=a.get(schema.CONFIRMED),
        duplicate_of=a.get(schema.DUPLICATE_OF),
        intermediate=dict(trial.intermediate_values),
        results=tuple(_result(r) for r in m.get("results") or ()),
    )


def records(study) -> list[TrialRecord]:
    """Every trial of a study, in trial order."""
    return [record(t) for t in study.get_trials(deepcopy=False)]


def evaluated_count(history: list[TrialRecord]) -> int:
    """Search trials whose config reached the evaluator: what n_trials counts."""
    return sum(1 for r in history if r.is_search and r.evaluated)


def best(history: list[TrialRecord]) -> TrialRecord | None:
    """The search trial with the highest geomean TFLOPS among those that passed."""
    candidates = [r for r in history if r.is_search and r.evaluated and r.ok]
    return max(candidates, key=lambda r: (r.value, -r.number)) if candidates else None


def confirmations(history: list[TrialRecord], number: int) -> list[TrialRecord]:
    """Finished re-measurements of trial `number`."""
    return [r for r in history if r.confirmation_of == number and r.state in FINISHED]


def winner(history: list[TrialRecord]) -> TrialRecord | None:
    """The best search trial that no confirmation has refuted (confirmed or not yet confirmed)."""
    refuted = {r.confirmation_of for r in history if r.confirmation_of is not None and r.state in FINISHED and not r.confirmed}
    candidates = [r for r in history if r.is_search and r.evaluated and r.ok and r.number not in refuted]
    return max(candidates, key=lambda r: (r.value, -r.number)) if candidates else None


def measured(history: list[TrialRecord]) -> dict[tuple, TrialRecord]:
    """First search trial that evaluated each config, keyed by its sorted knob items."""
    seen: dict[tuple, TrialRecord] = {}
    for r in history:
        if r.is_search and r.evaluated:
            seen.setdefault(config_key(r.config), r)
    return seen


def config_key(config: dict) -> tuple:
    """A hashable key of a config dict."""
    return tuple(sorted(config.items()))


def short_config(config: dict) -> str:
    """Knobs as k=v, leaving out the kernel class while it is ForwardConfig's default (upstream's): how the
    terminal view, the report, the notes and apply write a config on one line."""
    return " ".join(f"{k}={v}" for k, v in config.items() if not (k == "kernel" and v == DEFAULT_KERNEL))
