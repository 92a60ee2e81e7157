"""What a study shows: upstream's default as measured, the confirmed winner, the gate record, and where
the numbers come from (native SM120, emulated, replayed, synthetic). The dashboard notes, the plots and
the export read studies through this module only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial

from fa4tune import emulated_occupancy
from fa4tune.config import ProblemClass
from search.space import get_space
from search.storing import schema
from search.storing.history import TrialRecord, config_key, confirmations, record, winner


@dataclass(frozen=True)
class StudyEvidence:
    """One search study read back from the storage."""

    name: str
    direction: str  # "fwd" | "bwd"
    problem_class: ProblemClass
    target: str
    problems: list[str]
    meta: dict  # the study's user attrs
    trials: list[FrozenTrial]
    history: list[TrialRecord] = field(default_factory=list)

    @property
    def search_trials(self) -> list[TrialRecord]:
        """Finished trials of the search itself (confirmations left out)."""
        return [r for r in self.history if r.is_search]

    def user_attrs(self, number: int) -> dict:
        """The user attrs of trial `number`."""
        return next(t.user_attrs for t in self.trials if t.number == number)

    def default_config(self) -> dict:
        """Upstream's SM120 default for this class (flash-attn-4's interface.py), as a config dict."""
        return get_space(self.direction).upstream(self.problem_class).to_dict()

    def default(self) -> TrialRecord | None:
        """The trial that measured upstream's default and passed (the `baseline` trial first), or None."""
        key = config_key(self.default_config())
        found = [r for r in self.history if r.is_search and r.evaluated and r.ok and config_key(r.config) == key]
        return min(found, key=lambda r: (r.proposer != "baseline", r.number)) if found else None

    def default_failed(self) -> TrialRecord | None:
        """The trial that measured upstream's default and did not pass, or None."""
        key = config_key(self.default_config())
        return next((r for r in self.history if r.is_search and r.evaluated and not r.ok and config_key(r.config) == key), None)

    def winner(self) -> TrialRecord | None:
        """The best search trial no confirmation has refuted (search.storing.history.winner)."""
        return winner(self.history)

    def confirmed(self, number: int) -> list[TrialRecord]:
        """Confirmations of trial `number` that passed the gate within tolerance."""
        return [c for c in confirmations(self.history, number) if c.confirmed]

    def occupancy(self, number: int) -> str:
        """The CTAs per SM an emulated trial ran at: "target" (padded to the target's) or "device" (the emulating
        GPU's own, as every trial before the padding existed); "" for a trial that was not emulated."""
        t = next((t for t in self.trials if t.number == number), None)
        if t is None or t.user_attrs.get(schema.MODE) != "emulated":
            return ""
        return t.user_attrs.get(schema.OCCUPANCY, emulated_occupancy.DEVICE)

    def source(self) -> tuple[str, str]:
        """(device, mode) of the evaluated trials, the most common pair."""
        pairs = Counter(
            (t.user_attrs.get(schema.DEVICE, ""), t.user_attrs.get(schema.MODE, ""))
            for t in self.trials if t.user_attrs.get(schema.EVALUATED) and t.user_attrs.get(schema.DEVICE)
        )
        return pairs.most_common(1)[0][0] if pairs else ("", "")


def load_studies(storage, target: str | None = None) -> list[StudyEvidence]:
    """Every search study of the storage (of one target when given), in storage order."""
    found = []
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        meta = summary.user_attrs
        if schema.DIRECTION not in meta or (target and meta.get(schema.TARGET) != target):
            continue
        found.append(load_study(storage, summary.study_name))
    return found


def load_study(storage, name: str) -> StudyEvidence:
    """One search study by name."""
    study = optuna.load_study(study_name=name, storage=storage)
    meta = study.user_attrs
    trials = study.get_trials(deepcopy=False)
    return StudyEvidence(
        name=name, direction=meta[schema.DIRECTION], problem_class=ProblemClass.parse(meta[schema.PROBLEM_CLASS]),
        target=meta.get(schema.TARGET, ""), problems=list(meta.get(schema.PROBLEMS) or []), meta=dict(meta),
        trials=trials, history=[record(t) for t in trials],
    )


def replayed_table(device: str) -> str:
    """The table named in a replayed trial's device ('NVIDIA H200 (replayed from t.json)' -> 't.json'), or ''."""
    return device.split("(replayed from ", 1)[1].rstrip(")") if "(replayed from " in device else ""


def source_label(device: str, mode: str, table_meta: dict | None = None) -> str:
    """Where numbers come from, in the words figures and notes use (never passes emulation off as SM120)."""
    if mode == "synthetic" or (table_meta or {}).get("synthetic"):
        return "SYNTHETIC test data, not a measurement"
    if mode == "replay" and table_meta:
        recorded = source_label(table_meta.get("device", ""), table_meta.get("mode", ""))
        return f"{recorded} (replayed from {replayed_table(device) or 'a recorded table'})"
    if mode == "emulated":
        return f"SM120 kernels emulated on {device}"
    if mode == "native":
        return f"SM120 hardware: {device}"
    if mode == "replay":
        return f"{device}: replayed from a recorded table, not measured by this run"
    return f"{device or 'unknown device'} ({mode or 'unknown mode'})"


def mode_sentence(device: str, mode: str, table_meta: dict | None = None) -> str:
    """One plain sentence on whether these are SM120 hardware numbers."""
    if mode == "replay":
        first = f"Replayed from the recorded table {replayed_table(device) or device}, not measured by this run."
        if table_meta:
            return f"{first} The table's numbers: {mode_sentence(table_meta.get('device', ''), table_meta.get('mode', ''))}"
        return first + " The table records its own device and mode."
    if mode == "emulated":
        return (f"EMULATED, not SM120 hardware: upstream's SM120 kernels (SM80 mma.sync code) compiled for and timed "
                f"on {device}; the 99 KB shared-memory rule is SM120's, the speed is the {device}'s.")
    if mode == "native":
        return f"Native: measured on SM120 hardware ({device})."
    if mode == "synthetic":
        return "SYNTHETIC test data: invented numbers, not a measurement."
    return f"Mode {mode or 'unknown'} on {device or 'an unknown device'}."
