"""One study's search: turns between the sampler and the proposers, ask -> feasibility -> evaluate -> tell.

A config that the static rules reject never reaches the evaluator: it is told with the penalty value
and a constraint > 0, which TPE and GP both read (a FAIL trial would be ignored and re-proposed).
After n_trials evaluated configs, the winner is re-measured (`confirmations` times) so that `apply`
can trust it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import optuna

from fa4tune.measurement import Measurement, ProblemResult
from search import attrs
from search.evaluators import Evaluator
from search.history import TrialRecord, best, config_key, confirmations, evaluated_count, measured, record, records, winner
from search.live import PlainView
from search.proposers.base import Context, Proposer, ProposerUnavailable, check_proposals
from fa4tune import results_tsv
from search.results_log import trial_row
from search.study import StudySpec, close_interrupted, enqueue_baseline, waiting
from search.turns import FixedRatio

PENALTY = 0.0  # the value of an infeasible or failed trial (its constraint says why)
CONFIRMATION = "confirmation"
EXPLORE = "explore"  # a random unmeasured feasible config, drawn when the sampler keeps repeating itself


class StopFlag:
    """Set by the SIGINT handler: stop after the current trial."""

    def __init__(self):
        self.requested = False


@dataclass
class LoopSettings:
    """How one study is searched (the same for every study of a run)."""

    n_trials: int = 40  # configs that reach the evaluator, per study
    k: int = 4  # configs a proposer suggests per turn
    confirmations: int = 2  # re-measurements of the winner before apply trusts it
    tolerance: float = 0.05  # a confirmation may be this much slower than the original and still confirm
    baseline: bool = True  # measure upstream's default config first
    max_stall: int = 60  # stop after this many trials in a row that measured nothing new
    max_repeats: int = 2  # after this many sampler proposals in a row of measured configs, explore instead
    pass_cooldown: int = 2  # trials a proposer sits out after passing a turn
    results_path: str | None = None  # results.tsv; None: no rows
    git_commit: str = ""
    description: str = ""


@dataclass
class Outcome:
    """How a study's search ended."""

    study: str
    evaluated: int
    stopped: str = ""  # "", "interrupted" or "stalled"
    winner: TrialRecord | None = None
    confirmed: bool = False
    requeued: list[int] = field(default_factory=list)


class StudyLoop:
    """Runs one study to its n_trials, resuming whatever a previous run left."""

    def __init__(
        self,
        study: optuna.Study,
        spec: StudySpec,
        evaluator: Evaluator,
        sampler_name: str,
        proposers: list[Proposer],
        policy: FixedRatio,
        settings: LoopSettings,
        view=None,
        stop: StopFlag | None = None,
        disabled: dict[str, str] | None = None,
    ):
        self.study = study
        self.spec = spec
        self.space = spec.space
        self.distributions = self.space.distributions()
        self.evaluator = evaluator
        self.sampler_name = sampler_name
        self.proposers = {p.name: p for p in proposers}
        self.policy = policy
        self.settings = settings
        self.view = view or PlainView()
        self.stop = stop or StopFlag()
        self.disabled = disabled if disabled is not None else {}  # proposer -> why (shared by a run's studies)
        self.cooldown_until: dict[str, int] = {}
        self.trials_run = 0
        self.repeats = 0  # sampler proposals in a row that were already measured
        self.rng = random.Random(f"{spec.name}:{len(study.trials)}")

    def run(self) -> Outcome:
        """Search, then confirm the winner; returns how it ended."""
        outcome = Outcome(self.spec.name, 0, requeued=self._resume())
        outcome.stopped = self._search()
        if outcome.stopped != "interrupted":
            outcome.winner, outcome.confirmed = self._confirm()
            if self.stop.requested and not outcome.confirmed:
                outcome.stopped = "interrupted"
        outcome.evaluated = evaluated_count(records(self.study))
        return outcome

    def _resume(self) -> list[int]:
        """Requeues what a killed run left running; enqueues upstream's default into a new study."""
        requeued = close_interrupted(self.study)
        if requeued:
            self.view.message(f"[{self.spec.name}] resumed: trials {', '.join(map(str, requeued))} were left running, closed as failed and requeued")
        self._enqueue_baseline()
        return requeued

    def _enqueue_baseline(self) -> None:
        if self.settings.baseline:
            enqueue_baseline(self.study, self.spec)

    def _stop_reason(self, evaluated: int, stall: int) -> str | None:
        """'' when n_trials configs were evaluated, 'interrupted' / 'stalled', or None to go on."""
        if evaluated >= self.settings.n_trials:
            return ""
        if self.stop.requested:
            return "interrupted"
        if stall >= self.settings.max_stall:
            self.view.message(f"[{self.spec.name}] stopped: {stall} trials in a row were infeasible or already measured")
            return "stalled"
        return None

    def _search(self) -> str:
        """Trials until n_trials configs were evaluated; '' then, or 'interrupted' / 'stalled'."""
        stall = 0
        while True:
            history = records(self.study)
            evaluated = evaluated_count(history)
            if (reason := self._stop_reason(evaluated, stall)) is not None:
                return reason
            if not waiting(self.study):
                self._take_turn(history, self.settings.n_trials - evaluated)
            r = self._run_trial(self.study.ask(self.distributions), history)
            stall = 0 if r.evaluated else stall + 1
            self.repeats = self.repeats + 1 if r.duplicate_of is not None and r.proposer == self.sampler_name else 0

    # -- turns -------------------------------------------------------------------------------

    def _available(self) -> list[str]:
        names = [self.sampler_name]
        for name in self.proposers:
            if name not in self.disabled and self.trials_run >= self.cooldown_until.get(name, 0):
                names.append(name)
        return names

    def _take_turn(self, history: list[TrialRecord], remaining: int) -> None:
        name = self.policy.next(history, self._available())
        self.view.turn(self.spec.name, name)
        if name == self.sampler_name:
            if self.repeats >= self.settings.max_repeats:
                self._explore(history)
            return
        proposer = self.proposers[name]
        context = Context(self.space, self.spec.problem_class, list(self.spec.problems), self.spec.target, history, min(self.settings.k, remaining))
        try:
            proposals = proposer.propose(context)
        except ProposerUnavailable as err:
            if err.permanent:
                self.disabled[name] = str(err)
                self.view.message(f"{name}: {err}")
            else:
                self._pass(name, str(err))
            return
        checked = check_proposals(proposals, context)
        if checked.rejected:
            proposer.feedback(checked.rejected)
            counts = dict(self.study.user_attrs.get(attrs.REJECTED_PROPOSALS, {}))
            counts[name] = counts.get(name, 0) + len(checked.rejected)
            self.study.set_user_attr(attrs.REJECTED_PROPOSALS, counts)
        for config, proposal in checked.accepted:
            self.study.enqueue_trial(self.space.params(config), user_attrs={attrs.PROPOSER: name, attrs.RATIONALE: proposal.rationale})
        if not checked.accepted:
            reasons = "; ".join(r.reason for r in checked.rejected[:3])
            self._pass(name, f"no valid proposal ({len(checked.rejected)} rejected: {reasons})")

    def _explore(self, history: list[TrialRecord]) -> None:
        """Enqueues a random feasible config not measured yet: the sampler has converged or is stuck."""
        config = self.space.random_feasible(self.spec.problem_class, self.spec.target, self.rng, set(measured(history)))
        if config is not None:
            why = f"{self.sampler_name} proposed {self.repeats} measured configs in a row: a random unmeasured feasible config instead"
            self.study.enqueue_trial(self.space.params(config), user_attrs={attrs.PROPOSER: EXPLORE, attrs.RATIONALE: why})
        self.repeats = 0

    def _pass(self, name: str, why: str) -> None:
        self.cooldown_until[name] = self.trials_run + self.settings.pass_cooldown
        self.view.message(f"[{self.spec.name}] {name}: {why}; the sampler takes the turn")
        self.view.turn(self.spec.name, self.sampler_name)

    # -- one trial -----------------------------------------------------------------------------

    def _run_trial(self, trial: optuna.Trial, history: list[TrialRecord]) -> TrialRecord:
        config = self.space.config(trial.params)
        given = trial.user_attrs
        proposer = given.get(attrs.PROPOSER) or self.sampler_name
        trial.set_user_attr(attrs.PROPOSER, proposer)
        trial.set_user_attr(attrs.CONFIG, config.to_dict())
        confirmation_of = given.get(attrs.CONFIRMATION_OF)
        verdict = self.space.check(config, self.spec.problem_class, self.spec.target)
        earlier = measured(history).get(config_key(config.to_dict())) if confirmation_of is None else None
        m = None
        if not verdict:
            violation = self.space.violation(config, self.spec.problem_class, self.spec.target, verdict)
            value, found = PENALTY, {attrs.STATUS: "infeasible", attrs.RULE: verdict.rule, attrs.REASON: verdict.message, attrs.EVALUATED: False}
        elif earlier is not None:
            violation = 0.0 if earlier.ok else 1.0
            value = earlier.value if earlier.ok else PENALTY
            found = {
                attrs.STATUS: earlier.status, attrs.GEOMEAN_TFLOPS: earlier.value, attrs.TFLOPS: earlier.tflops,
                attrs.DUPLICATE_OF: earlier.number, attrs.EVALUATED: False,
                attrs.REASON: f"already measured in trial #{earlier.number}",
            }
        else:
            m = self._evaluate(config)
            value = m.geomean_tflops() if m.ok else PENALTY
            violation = 0.0 if m.ok else 1.0
            found = {**measurement_attrs(m), attrs.EVALUATED: True}
            if confirmation_of is not None:
                original = next(r for r in history if r.number == confirmation_of)
                found[attrs.CONFIRMED] = bool(m.ok and value >= (1 - self.settings.tolerance) * original.value)
        found.update({attrs.CONSTRAINT: [violation], attrs.GIT_COMMIT: self.settings.git_commit, attrs.TARGET: self.spec.target.name})
        for key, item in found.items():
            trial.set_user_attr(key, item)
        trial.set_constraint(attrs.CONSTRAINT_KEY, violation)
        r = record(self.study.tell(trial, value))
        self.trials_run += 1
        if self.settings.results_path:
            row = trial_row(self.spec, r, m, self.settings.git_commit, getattr(self.evaluator, "harness_sha256", ""), self.settings.description)
            results_tsv.append_row(self.settings.results_path, row)
        history = history + [r]
        self.view.trial(self.spec.name, r, best(history), evaluated_count(history), self.settings.n_trials)
        return r

    def _evaluate(self, config) -> Measurement:
        try:
            return self.evaluator.evaluate(self.space.direction, config, self.spec.problem_class, list(self.spec.problems))
        except Exception as err:  # an evaluator bug or a lost GPU must not end the study
            results = tuple(ProblemResult(p.label, self.space.direction, "crash", reason=f"{type(err).__name__}: {err}") for p in self.spec.problems)
            return Measurement(self.space.direction, self.spec.problem_class.name, config.to_dict(), results,
                               self.spec.target.name, "", "", evaluator=type(self.evaluator).__name__)

    # -- confirmation --------------------------------------------------------------------------

    def _confirm(self) -> tuple[TrialRecord | None, bool]:
        """Re-measures the winner until it has `confirmations` passing re-measurements (or is refuted)."""
        need = self.settings.confirmations
        self.view.turn(self.spec.name, CONFIRMATION)
        for _ in range(4 * need + 4):
            history = records(self.study)
            w = winner(history)
            if w is None:
                return None, False
            if confirmed_count(history, w) >= need:
                return w, True
            if self.stop.requested:
                return w, False
            if not waiting(self.study):
                self._enqueue_confirmation(w)
            self._run_trial(self.study.ask(self.distributions), history)
        history = records(self.study)
        return winner(history), False

    def _enqueue_confirmation(self, w: TrialRecord) -> None:
        """Queues a re-measurement of the winner's config."""
        self.study.enqueue_trial(self.space.params(self.space.config(w.config)),
                                 user_attrs={attrs.PROPOSER: CONFIRMATION, attrs.CONFIRMATION_OF: w.number})


def confirmed_count(history: list[TrialRecord], w: TrialRecord) -> int:
    """How many re-measurements confirmed the winner (passed the gate, within tolerance)."""
    return sum(1 for c in confirmations(history, w.number) if c.confirmed)


def measurement_attrs(m: Measurement) -> dict:
    """The trial attributes of a measurement."""
    found = {
        attrs.STATUS: m.status, attrs.REASON: m.reason, attrs.GEOMEAN_TFLOPS: m.geomean_tflops(),
        attrs.TFLOPS: {r.problem: r.tflops for r in m.results if r.tflops is not None},
        attrs.RESULTS: [r.to_dict() for r in m.results],
        attrs.DEVICE: m.device, attrs.MODE: m.mode, attrs.EVALUATOR: m.evaluator,
    }
    errors = {r.problem: r.max_errors for r in m.results if r.max_errors}
    if errors:
        found[attrs.ERRORS] = errors
    if m.static:
        found[attrs.STATIC] = m.static
    return found
