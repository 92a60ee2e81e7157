"""`python -m search apply`: confirmed winners -> experiment.py's FORWARD_DISPATCH / BACKWARD_DISPATCH.

A winner is applied only if it passed the correctness gate and the harness re-measured it
`confirmations` times within tolerance (trials with user attr confirmation_of). The dict entries are
edited as text (one entry per line, long ones wrapped), so the file stays readable and the diff small.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

import optuna

from fa4tune.config import ConfigError, ProblemClass
from search.space import get_space
from search.storing import schema
from search.storing.dispatch_table import DISPATCH, edit_dispatch, effective_entry_config, entry_config
from search.storing.history import FINISHED, config_key, confirmations, measured, records, short_config, winner



@dataclass(frozen=True)
class Decision:
    """What apply does with one study: a config to write, or why not."""

    study: str
    direction: str
    problem_class: str
    config: dict | None
    refusal: str = ""  # 'rule: why' (an `error:` line)
    note: str = ""


def decide(storage, needed: int = 2, allow_replay: bool = False, target: str | None = None, source: str | None = None) -> list[Decision]:
    """One decision per search study in the storage (of one target when given). With experiment.py's `source`, a
    study whose class's entry is not upstream's default and was never measured by that study is refused: its
    winner beat upstream's default, not necessarily what the table holds."""
    decisions = []
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        meta = summary.user_attrs
        if schema.DIRECTION not in meta or (target and meta.get(schema.TARGET) != target):
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        history = records(study)
        decision = _decide(summary.study_name, meta, history, needed, allow_replay)
        if source is not None and decision.refusal.startswith("unconfirmed_winner:"):
            decision = _entry_holds(decision, source, history)
        if decision.config is not None:
            decision = _check_shortest_problem(decision, meta.get(schema.TARGET))
        if source is not None and decision.config is not None:
            decision = _check_incumbent(decision, source, history)
        decisions.append(decision)
    return decisions


def _check_shortest_problem(decision: Decision, target_name: str | None) -> Decision:
    """The decision, or a refusal when the winner's per-problem rules refuse its class's shortest problem: an entry
    runs every problem of its class, and a winner measured on long KVs may not run short ones (a fixed num_splits
    needs as many KV blocks)."""
    if decision.direction != "fwd":
        return decision
    from fa4tune.feasibility import check_forward_entry
    from fa4tune.targets import get_target

    pc = ProblemClass.parse(decision.problem_class)
    verdict = check_forward_entry(get_space("fwd").config(decision.config), pc, get_target(target_name))
    if verdict:
        return decision
    return replace(decision, config=None, refusal=(
        f"entry_refuses_short_problems: {decision.note.split(', confirmed')[0]} would be {DISPATCH['fwd']}"
        f"[{decision.problem_class!r}], which runs every problem of the class, and its rules refuse {pc.shortest_problem().name}: "
        f"{verdict}; a config whose choice depends on the length (num_splits=0: the heuristic) can be the entry"))


def _entry_holds(decision: Decision, source: str, history) -> Decision:
    """The decision, or a note that the study's best is the table's entry itself: nothing would change, so no
    confirmation is owed (a study whose incumbent wins, as the enqueued entry often does, is not a refusal)."""
    space, w = get_space(decision.direction), winner(history)
    written = effective_entry_config(source, decision.direction, ProblemClass.parse(decision.problem_class))
    if written is None or space.config(written) != space.config(w.config):
        return decision
    return replace(decision, refusal="", note=(
        f"{decision.study}: best trial #{w.number} ({w.value:.1f} TFLOPS) is {DISPATCH[decision.direction]}"
        f"[{decision.problem_class!r}] as the table holds it: the entry holds, nothing to write"))


def _check_incumbent(decision: Decision, source: str, history) -> Decision:
    """The decision, or a refusal when the table's entry (not upstream's default) is not among the study's measured configs."""
    space = get_space(decision.direction)
    written = effective_entry_config(source, decision.direction, ProblemClass.parse(decision.problem_class))
    if written is None:
        return decision
    entry = space.config(written)
    if entry == space.upstream(ProblemClass.parse(decision.problem_class)) or config_key(entry.to_dict()) in measured(history):
        return decision
    return replace(decision, config=None, refusal=(
        f"unmeasured_table_entry: {decision.study}: {DISPATCH[decision.direction]}[{decision.problem_class!r}] holds "
        f"{short_config(entry.to_dict())}, not upstream's default, and this study never measured it, so its winner "
        f"({decision.note.split(', confirmed')[0]}) may be slower than what the table runs; a new study measures the "
        "entry first (search run enqueues it after the baseline), or edit the entry by hand"))


def _decide(name: str, meta: dict, history, needed: int, allow_replay: bool) -> Decision:
    direction, pc = meta[schema.DIRECTION], meta[schema.PROBLEM_CLASS]
    w = winner(history)
    if w is None and not any(r.state in FINISHED for r in history):
        return Decision(name, direction, pc, None, f"study_empty: {name}: the study has no finished trials (a run killed before "
                                                   "its first one ended leaves them RUNNING): run `python -m search run` again")
    if w is None:
        return Decision(name, direction, pc, None, f"no_winner: {name}: no trial passed the correctness gate, so there is no winner")
    head = f"{name}: best trial #{w.number} ({w.value:.1f} TFLOPS, {short_config(w.config)})"
    if w.evaluator == "replay" and not allow_replay:
        return Decision(name, direction, pc, None, f"replayed_winner: {head} was replayed from a table, not measured by the harness "
                                                   "(--allow-replay to apply it anyway)")
    confirmed = [c for c in confirmations(history, w.number) if c.confirmed]
    if len(confirmed) < needed:
        return Decision(name, direction, pc, None, f"unconfirmed_winner: {head} is confirmed {len(confirmed)} of {needed} times; "
                                                   "run the same `python -m search run` again to confirm it")
    values = ", ".join(f"{c.value:.1f}" for c in confirmed)
    replayed = " (replayed from a table, not measured by the harness)" if w.evaluator == "replay" else ""
    return Decision(name, direction, pc, w.config, note=f"{head}, confirmed at {values} TFLOPS{replayed}")


def apply(source: str, decisions: list[Decision]) -> str:
    """The source with every accepted decision written; each written entry is read back and compared. An entry
    that already holds the decision's config is left as it is written (its line breaks too), so the diff shows only
    the entries that change."""
    for d in decisions:
        if d.config is None:
            continue
        config = get_space(d.direction).config(d.config)
        held = entry_config(source, d.direction, d.problem_class)
        if held is not None and get_space(d.direction).config(held) == config:
            continue
        source = edit_dispatch(source, d.direction, d.problem_class, config)
        written = entry_config(source, d.direction, d.problem_class)
        if get_space(d.direction).config(written or {}) != config:
            raise ConfigError("dispatch_format", f"{DISPATCH[d.direction]}[{d.problem_class!r}] did not read back as written")
    return source


def unified_diff(old: str, new: str, path: str) -> str:
    """A unified diff of the edit, for the terminal."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"))
