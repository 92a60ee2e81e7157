"""One study's search: turns between the sampler and the proposers, ask -> feasibility -> evaluate -> tell.

One loop for every way of running: a local `search run` is one worker whose study lock is a lock of this
process (its slots, threads with a trial each in flight, take turns), and `search worker` is the same loop
with the storage-wide lock, claims and heartbeats of search.storing.claims (search.running.worker.WorkerLoop only
changes how a study is resumed and how a running trial shows it is alive), as Optuna's `_run_trial` serves
both its sequential and its parallel `optimize`.

A config that the static rules reject never reaches the evaluator: it is told PRUNED without a value and with
a constraint > 0, which TPE and GP both read (a FAIL trial would be ignored and re-proposed; a value of 0 would
flatten the dashboard's history plot); so is a config whose measurement failed (see `told`). A config
measured before is copied (`duplicate_of`) and costs no budget: `n_trials` counts distinct configs that
reached the evaluator. A hopeless config is pruned (search.evaluating.pruning); the baseline and the incumbent never
are, since every winner is compared with them. When every feasible config was measured the study stops and
says so. After n_trials, the winner is re-measured (`confirmations` times) so that `apply` can trust it; a study
already finished is left as it is.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import optuna
from optuna.trial import TrialState

from fa4tune import emulated_occupancy
from fa4tune.harness import results_tsv
from fa4tune.harness.measurement import Measurement, ProblemResult
from search.evaluating.protocol import Evaluator
from search.evaluating.pruning import DEFAULT_FACTOR, PRUNED, TrialMonitor, best_tflops, give_up_ms
from search.proposing.proposer import Context, Proposer, ProposerUnavailable, check_proposals
from search.proposing.turns import FixedRatio
from search.running.view import PlainView
from search.storing import schema
from search.storing.claims import counted_history, find_claim, in_flight_evaluations, pending_turns, set_pending_turn
from search.storing.history import TrialRecord, best, config_key, confirmations, evaluated_count, measured, record, records, winner
from search.storing.results_log import trial_row
from search.storing.study import BASELINE, INCUMBENT, close_interrupted, enqueue_baseline, waiting

PENALTY = 0.0  # what the GP sampler is shown for an infeasible or failed trial (search.proposing.samplers.ConstrainedGPSampler)
TOLD_DIGITS = 2  # the value told to Optuna is rounded to 0.01 TFLOPS (what the dashboard shows); the exact one is `geomean_tflops`
CONFIRMATION = "confirmation"
SPLIT_TWIN = "split-twin"  # a fixed-split winner's tiles with the heuristic's split count, measured before confirming
EXPLORE = "explore"  # a random unmeasured feasible config, drawn when the sampler keeps repeating itself
POLL_S = 0.25  # how often a slot looks again while others finish what it needs
# How a study's search ended (Outcome.stopped).
DONE, INTERRUPTED, STALLED, EXHAUSTED, FINISHED = "", "interrupted", "stalled", "exhausted", "finished"


class StopFlag:
    """Set by the SIGINT handler: stop after the current trial."""

    def __init__(self):
        self.requested = False


class LocalLock:
    """The study lock of a run in one process: its slots take turns (no other process works on the study)."""

    def __init__(self):
        self._lock = threading.RLock()

    @contextmanager
    def held(self):
        with self._lock:
            yield


@dataclass
class LoopSettings:
    """How one study is searched (the same for every study of a run)."""

    n_trials: int = 40  # distinct configs that reach the evaluator, per study
    k: int = 4  # configs a proposer suggests per turn
    confirmations: int = 2  # re-measurements of the winner before apply trusts it
    tolerance: float = 0.05  # a confirmation may be this much slower than the original and still confirm
    baseline: bool = True  # measure upstream's default config first
    max_stall: int = 60  # stop after this many trials in a row that measured nothing new
    max_repeats: int = 2  # after this many sampler proposals in a row of measured or infeasible configs, explore
    pass_cooldown: int = 2  # trials a proposer sits out after passing a turn
    prune_factor: float = DEFAULT_FACTOR  # a config this much slower than the best is pruned (0: never)
    results_path: str | None = None  # results.tsv; None: no rows
    git_commit: str = ""
    description: str = ""


def loop_settings_of(config, results_path: str | None, git_commit: str, description: str) -> LoopSettings:
    """The LoopSettings of a run's settings (search.running.run_config.RunConfig, or a worker's recorded ones)."""
    return LoopSettings(
        n_trials=config.n_trials, k=config.k, confirmations=config.confirmations, tolerance=config.tolerance,
        baseline=config.baseline, prune_factor=config.prune_factor, results_path=results_path, git_commit=git_commit,
        description=description,
    )


@dataclass
class Outcome:
    """How a study's search ended."""

    study: str
    evaluated: int
    stopped: str = DONE  # DONE, INTERRUPTED, STALLED, EXHAUSTED or FINISHED (nothing left to do)
    winner: TrialRecord | None = None
    confirmed: bool = False
    requeued: list[int] = field(default_factory=list)


class StudyLoop:
    """Runs one study to its n_trials, resuming whatever a previous run left; one slot of a worker.

    `lock`: the study lock (LocalLock for a run in one process, search.storing.claims.StudyLock across processes);
    `worker_id`: the name claims carry; `resume`: False for every slot but the first (the first one closes
    what a killed run left, once).
    """

    def __init__(
        self,
        study: optuna.Study,
        spec,
        evaluator: Evaluator,
        sampler_name: str,
        proposers: list[Proposer],
        policy: FixedRatio,
        settings: LoopSettings,
        view=None,
        stop: StopFlag | None = None,
        disabled: dict[str, str] | None = None,
        *,
        lock=None,
        worker_id: str = "local",
        resume: bool = True,
    ):
        self.study = study
        self.spec = spec
        self.space = spec.space
        self.distributions = self.space.distributions()
        self.evaluator = evaluator
        self.sampler_name = sampler_name
        self.proposers = {p.name: p for p in proposers}
        self.policy = _SharedPolicy(policy)
        self.settings = settings
        self.view = view or PlainView()
        self.stop = stop or StopFlag()
        self.disabled = disabled if disabled is not None else {}  # proposer -> why (shared by a run's studies)
        self.lock = lock or LocalLock()
        self.worker_id = worker_id
        self.resume = resume
        self.storage = study._storage
        self.cooldown_until: dict[str, int] = {}
        self.trials_run = 0
        self.repeats = 0  # sampler proposals in a row that were already measured or infeasible
        self.exhausted = False
        self.announces = True  # says the study's stop (run_study: the first slot only)
        self.rng = random.Random(f"{spec.name}:{len(study.trials)}:{worker_id}")

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Search, then confirm the winner; returns how it ended (a finished study is left untouched).
        With `resume` False (the other slots of run_study), the finished check and the resume are skipped."""
        if self.resume and self._finished():
            return self._outcome(FINISHED)
        outcome = Outcome(self.spec.name, 0, requeued=self._resume() if self.resume else [])
        outcome.stopped = self._search()
        if outcome.stopped != INTERRUPTED:
            outcome.winner, outcome.confirmed = self._confirm()
            if self.stop.requested and not outcome.confirmed:
                outcome.stopped = INTERRUPTED
        history = records(self.study)
        outcome.winner = outcome.winner or winner(history)  # after Ctrl-C: the best so far, not confirmed
        outcome.evaluated = evaluated_count(history)
        return outcome

    def _finished(self) -> bool:
        """True when an earlier run finished this study: its budget (or its space) spent and its winner confirmed."""
        history = records(self.study)
        if any(r.state in ("RUNNING", "WAITING") for r in history):
            return False
        spent = evaluated_count(history) >= self.settings.n_trials or self._space_left(history) == 0
        w = winner(history)
        done = spent and (w is None or confirmed_count(history, w) >= self.settings.confirmations)
        if done:
            best_text = f"best {w.value:.1f} TFLOPS (#{w.number}, confirmed)" if w else "no config passed"
            self.view.message(f"[{self.spec.name}] finished earlier: {evaluated_count(history)} evaluated, {best_text}; nothing to do "
                              f"(raise --n-trials to search further)")
        return done

    def _outcome(self, stopped: str) -> Outcome:
        history = records(self.study)
        w = winner(history)
        return Outcome(self.spec.name, evaluated_count(history), stopped, w,
                       bool(w) and confirmed_count(history, w) >= self.settings.confirmations)

    def _resume(self) -> list[int]:
        """Closes and requeues what a killed run left running; enqueues upstream's default into a new study."""
        with self.lock.held():
            requeued = close_interrupted(self.study)
            if requeued:
                trials = f"trial {requeued[0]} was" if len(requeued) == 1 else f"trials {', '.join(map(str, requeued))} were"
                self.view.message(f"[{self.spec.name}] resumed: {trials} left running, closed as failed and requeued")
            self._enqueue_baseline()
        return requeued

    def _fail_stale(self) -> None:
        """Fails trials whose worker died (workers only; a local run's slots are all alive)."""

    def _heartbeat(self, trial: optuna.Trial):
        """A context that shows other workers this trial is alive (workers only)."""
        return nullcontext()

    def _enqueue_baseline(self) -> None:
        if self.settings.baseline:
            enqueue_baseline(self.study, self.spec)

    def _space_left(self, history: list[TrialRecord]) -> int:
        """Feasible configs of the space not measured yet."""
        done = set(measured(history))
        return sum(1 for c in self.space.feasible(self.spec.problem_class, self.spec.target) if config_key(c.to_dict()) not in done)

    def _stop_reason(self, evaluated: int, stall: int) -> str | None:
        """DONE when n_trials configs were evaluated, INTERRUPTED / STALLED / EXHAUSTED, or None to go on."""
        if evaluated >= self.settings.n_trials:
            return DONE
        if self.stop.requested:
            return INTERRUPTED
        if self.exhausted:
            if not self.announces:  # every slot of a run stops here; the first one says so
                return EXHAUSTED
            total = len(self.space.feasible(self.spec.problem_class, self.spec.target))
            self.view.message(f"[{self.spec.name}] stopped: the space is exhausted, all {total} feasible configs were measured "
                              f"({evaluated} of --n-trials {self.settings.n_trials})")
            return EXHAUSTED
        if stall >= self.settings.max_stall:
            self.view.message(f"[{self.spec.name}] stopped: {stall} trials in a row were infeasible or already measured")
            return STALLED
        return None

    def _search(self) -> str:
        """Trials until n_trials configs were evaluated; DONE then, or INTERRUPTED / STALLED / EXHAUSTED."""
        stall = 0
        if self._space_left(records(self.study)) == 0:
            self.exhausted = True
        while True:
            asked, turn = None, None
            with self.lock.held():
                self._fail_stale()
                trials = self.study.get_trials(deepcopy=False)
                history = [record(t) for t in trials]
                evaluated = evaluated_count(history)
                if (reason := self._stop_reason(evaluated, stall)) is not None:
                    return reason
                remaining = self.settings.n_trials - evaluated - in_flight_evaluations(trials)
                if remaining > 0:
                    if waiting(self.study):
                        asked = self._ask()
                    else:
                        turn = self._decide(history, remaining)
                        if turn is None and not self.exhausted:
                            asked = self._ask()
            if turn is not None:
                self._proposer_turn(turn, history, remaining)
                continue
            if asked is None:  # the last configs are being measured by other slots or workers
                time.sleep(POLL_S)
                continue
            r = self._measure(asked)
            if r is None:
                continue
            stall = 0 if r.evaluated else stall + 1
            # a sampler proposal that measured nothing (a copy, or a config the rules refuse) counts toward exploring:
            # TPE on a space mostly refused by the rules re-proposed refused configs until the stall stop
            # (2026-12-06-h100-models-twins-varlen.md: 5 configs evaluated of 30 in a causal backward study)
            wasted = r.duplicate_of is not None or r.status == "infeasible"
            self.repeats = self.repeats + 1 if wasted and r.proposer == self.sampler_name else 0

    # -- turns -------------------------------------------------------------------------------

    def _available(self) -> list[str]:
        names = [self.sampler_name]
        for name in self.proposers:
            if name not in self.disabled and self.trials_run >= self.cooldown_until.get(name, 0):
                names.append(name)
        return names

    def _decide(self, history: list[TrialRecord], remaining: int) -> str | None:
        """Whose turn it is, counting every slot's and worker's trials; None for the sampler (exploring first
        if it keeps repeating itself); lock held."""
        others = {w: t for w, t in pending_turns(self.study).items() if w != self.worker_id}
        name = self.policy.inner.next(counted_history(history, others), self._available())
        if name != self.sampler_name:
            set_pending_turn(self.study, self.worker_id, name, min(self.settings.k, remaining))
            return name
        self.view.turn(self.spec.name, name)
        if self.repeats >= self.settings.max_repeats:
            self._explore(history)
        return None

    def _proposer_turn(self, name: str, history: list[TrialRecord], remaining: int) -> None:
        """The proposer's call runs outside the lock; its pending turn counts for it meanwhile."""
        try:
            self.policy.decided = name
            self._take_turn(history, remaining)
        finally:
            self.policy.decided = None
            with self.lock.held():
                set_pending_turn(self.study, self.worker_id, None)

    def _take_turn(self, history: list[TrialRecord], remaining: int) -> None:
        name = self.policy.next(history, self._available())
        self.view.turn(self.spec.name, name)
        if name == self.sampler_name:
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
        with self.lock.held():
            if checked.rejected:
                proposer.feedback(checked.rejected)
                counts = dict(self.study.user_attrs.get(schema.REJECTED_PROPOSALS, {}))
                counts[name] = counts.get(name, 0) + len(checked.rejected)
                self.study.set_user_attr(schema.REJECTED_PROPOSALS, counts)
            for config, proposal in checked.accepted:
                self.study.enqueue_trial(self.space.params(config), user_attrs={schema.PROPOSER: name, schema.RATIONALE: proposal.rationale})
        if not checked.accepted:
            reasons = "; ".join(r.reason for r in checked.rejected[:3])
            self._pass(name, f"no valid proposal ({len(checked.rejected)} rejected: {reasons})")

    def _explore(self, history: list[TrialRecord]) -> None:
        """Enqueues a random feasible config not measured yet: the sampler has converged or is stuck; notes
        when none is left (the space is exhausted)."""
        config = self.space.random_feasible(self.spec.problem_class, self.spec.target, self.rng, set(measured(history)))
        if config is None:
            self.exhausted = True
        else:
            why = (f"{self.sampler_name} proposed {self.repeats} measured or infeasible configs in a row: a random unmeasured "
                   "feasible config instead")
            self.study.enqueue_trial(self.space.params(config), user_attrs={schema.PROPOSER: EXPLORE, schema.RATIONALE: why})
        self.repeats = 0

    def _pass(self, name: str, why: str) -> None:
        self.cooldown_until[name] = self.trials_run + self.settings.pass_cooldown
        self.view.message(f"[{self.spec.name}] {name}: {why}; the sampler takes the turn")
        self.view.turn(self.spec.name, self.sampler_name)

    # -- one trial -----------------------------------------------------------------------------

    def _ask(self):
        """A trial (queued ones first) with its heartbeat beating, its proposer recorded and its config claimed,
        all before the lock is released, so that the other slots and workers count it at once; lock held."""
        trial = self.study.ask(self.distributions)
        beat = self._heartbeat(trial)
        beat.__enter__()
        trial.set_user_attr(schema.PROPOSER, trial.user_attrs.get(schema.PROPOSER) or self.sampler_name)
        return trial, beat, self._claim(trial)

    def _claim(self, trial: optuna.Trial) -> str:
        """'evaluate' (claimed: `worker` set), 'copy' (measured already), 'wait' (being measured), or 'skip':
        infeasible (never measured) or a confirmation (measured again on purpose, `worker` set); lock held."""
        config = self.space.config(trial.params)
        if not self.space.check(config, self.spec.problem_class, self.spec.target):
            return "skip"
        if trial.user_attrs.get(schema.CONFIRMATION_OF) is not None:
            trial.set_user_attr(schema.WORKER, self.worker_id)
            return "skip"
        state, _ = find_claim(self.study, trial, config, self.space)
        if state == "free":
            trial.set_user_attr(schema.WORKER, self.worker_id)
            return "evaluate"
        return "copy" if state == "measured" else "wait"

    def _measure(self, asked) -> TrialRecord | None:
        """The trial (evaluate, or copy what another trial measured), after any wait for the one measuring it."""
        trial, beat, claim = asked
        try:
            while claim == "wait":
                time.sleep(POLL_S)
                with self.lock.held():
                    self._fail_stale()  # the worker measuring it may be dead
                    claim = self._claim(trial)
            try:
                return self._run_trial(trial, records(self.study))
            except optuna.exceptions.UpdateFinishedTrialError:
                # our heartbeat stopped long enough for another worker to fail and requeue the trial
                self.view.message(f"[{self.spec.name}] trial {trial.number} was closed by another worker (heartbeat late); its requeued copy goes on")
                return None
        finally:
            beat.__exit__(None, None, None)

    def _run_trial(self, trial: optuna.Trial, history: list[TrialRecord]) -> TrialRecord:
        """The one trial function: rules, copy or evaluate (with pruning), tell, results.tsv row, view."""
        config = self.space.config(trial.params)
        given = trial.user_attrs
        proposer = given.get(schema.PROPOSER) or self.sampler_name
        trial.set_user_attr(schema.PROPOSER, proposer)
        trial.set_user_attr(schema.CONFIG, config.to_dict())
        confirmation_of = given.get(schema.CONFIRMATION_OF)
        verdict = self.space.check(config, self.spec.problem_class, self.spec.target)
        earlier = measured(history).get(config_key(config.to_dict())) if confirmation_of is None else None
        m, state = None, TrialState.COMPLETE
        if not verdict:
            violation = self.space.violation(config, self.spec.problem_class, self.spec.target, verdict)
            value, found = PENALTY, {schema.STATUS: "infeasible", schema.RULE: verdict.rule, schema.REASON: verdict.message, schema.EVALUATED: False}
        elif earlier is not None:
            violation = 0.0 if earlier.ok or earlier.status == PRUNED else 1.0
            value = earlier.value if earlier.ok else PENALTY
            found = {
                schema.STATUS: earlier.status, schema.GEOMEAN_TFLOPS: earlier.value, schema.TFLOPS: earlier.tflops,
                schema.DUPLICATE_OF: earlier.number, schema.EVALUATED: False,
                schema.REASON: f"already measured in trial #{earlier.number}",
            }
            if earlier.status == PRUNED:
                state, value = TrialState.PRUNED, None
                for step, v in earlier.intermediate.items():
                    trial.report(v, step)
        else:
            # the baseline and the incumbent are the references a winner is judged against: always measured whole
            reference = confirmation_of is not None or proposer in (BASELINE, INCUMBENT)
            monitor = None if reference else TrialMonitor(trial, self._limits(history))
            m = self._evaluate(config, monitor)
            value = m.geomean_tflops() if m.ok else PENALTY
            violation = 0.0 if m.ok else 1.0
            found = {**measurement_attrs(m), schema.EVALUATED: True}
            if m.status == PRUNED:
                state, value, violation = TrialState.PRUNED, None, 0.0
            if confirmation_of is not None:
                original = next(r for r in history if r.number == confirmation_of)
                found[schema.CONFIRMED] = bool(m.ok and value >= (1 - self.settings.tolerance) * original.value)
        found.update({schema.CONSTRAINT: [violation], schema.GIT_COMMIT: self.settings.git_commit, schema.TARGET: self.spec.target.name})
        for key, item in found.items():
            trial.set_user_attr(key, item)
        trial.set_constraint(schema.CONSTRAINT_KEY, violation)
        state, value = told(state, value, violation)
        r = record(self.study.tell(trial, value, state=state))
        self.trials_run += 1
        if self.settings.results_path:
            row = trial_row(self.spec, r, m, self.settings.git_commit, getattr(self.evaluator, "harness_sha256", ""), self.settings.description)
            results_tsv.append_row(self.settings.results_path, row)
        history = history + [r]
        self.view.trial(self.spec.name, r, best(history), evaluated_count(history), self.settings.n_trials)
        return r

    def _limits(self, history: list[TrialRecord]) -> dict[str, float]:
        """Give-up times per problem from the study's best results so far."""
        if not self.settings.prune_factor:
            return {}
        found = best_tflops([[{"problem": p, "status": "ok", "tflops": t} for p, t in r.tflops.items()] for r in history if r.is_search and r.ok])
        return give_up_ms(list(self.spec.problems), self.space.direction, found, self.settings.prune_factor)

    def _evaluate(self, config, monitor: TrialMonitor | None) -> Measurement:
        try:
            return self.evaluator.evaluate(self.space.direction, config, self.spec.problem_class, list(self.spec.problems), monitor=monitor)
        except Exception as err:  # an evaluator bug or a lost GPU must not end the study
            results = tuple(ProblemResult(p.label, self.space.direction, "crash", reason=f"{type(err).__name__}: {err}") for p in self.spec.problems)
            return Measurement(self.space.direction, self.spec.problem_class.name, config.to_dict(), results,
                               self.spec.target.name, "", "", evaluator=type(self.evaluator).__name__)

    # -- confirmation --------------------------------------------------------------------------

    def _confirm(self) -> tuple[TrialRecord | None, bool]:
        """Re-measures the winner until it has `confirmations` passing re-measurements (or is refuted),
        sharing the work with the other slots and workers."""
        need, ran = self.settings.confirmations, 0
        self.view.turn(self.spec.name, CONFIRMATION)
        while True:
            asked = None
            with self.lock.held():
                self._fail_stale()
                history = records(self.study)
                w = winner(history)
                if w is None:
                    return None, False
                done = confirmed_count(history, w)
                if self.stop.requested or ran >= 4 * need + 4:
                    return w, done >= need
                twin = self._split_twin(w, history)
                if twin is not None:  # measured first; where it wins, it is the one confirmed
                    if not any(r.proposer == SPLIT_TWIN and r.state in ("RUNNING", "WAITING") for r in history):
                        self.study.enqueue_trial(self.space.params(twin), user_attrs={
                            schema.PROPOSER: SPLIT_TWIN, schema.RATIONALE: f"trial #{w.number}'s tiles, the heuristic's split count"})
                    asked = self._ask() if waiting(self.study) else None
                elif done >= need:
                    return w, True
                elif waiting(self.study):
                    asked = self._ask()
                elif done + sum(r.confirmation_of == w.number and r.state in ("RUNNING", "WAITING") for r in history) < need:
                    self._enqueue_confirmation(w)
                    asked = self._ask()
            if asked is None:
                time.sleep(POLL_S)
                continue
            self._measure(asked)
            ran += 1

    def _split_twin(self, w: TrialRecord, history: list[TrialRecord]):
        """A winner that fixes its split count (split-KV) was measured on the suite's shapes alone, while an entry runs
        every batch and length of its class: its tiles with the heuristic's count (num_splits=0), where that is in the
        space, feasible and not measured yet; else None. One split won a study at 16 sequences and ran 2.4x upstream at
        one, where the same tiles split by the heuristic ran 17.7x (2026-12-07-h100-s16, section 6)."""
        config = self.space.config(w.config)
        if not getattr(config, "extra_knobs", {}).get("num_splits"):
            return None
        twin = replace(config, extra={**config.extra_knobs, "num_splits": 0})
        key = config_key(twin.to_dict())
        tried = key in measured(history) or any(r.proposer == SPLIT_TWIN and r.state not in ("RUNNING", "WAITING")
                                                and config_key(r.config) == key for r in history)  # (a replay's missing)
        if tried or self.space.in_domain(twin) or not self.space.check(twin, self.spec.problem_class, self.spec.target):
            return None
        return twin

    def _enqueue_confirmation(self, w: TrialRecord) -> None:
        """Queues a re-measurement of the winner's config."""
        self.study.enqueue_trial(self.space.params(self.space.config(w.config)),
                                 user_attrs={schema.PROPOSER: CONFIRMATION, schema.CONFIRMATION_OF: w.number})


def run_study(loops: list[StudyLoop]) -> Outcome:
    """Runs one study with one loop per slot (a thread each when there are several, so that several trials are in
    flight: the sampler asks for the next while earlier ones compile and measure, TPE's constant liar counting
    those running). The first slot checks whether the study is finished and resumes it, once, before the others start."""
    first = loops[0]
    if len(loops) == 1:
        return first.run()
    if first._finished():
        return first._outcome(FINISHED)
    requeued = first._resume()
    for loop in loops:
        loop.resume, loop.announces = False, loop is first
    with ThreadPoolExecutor(len(loops), thread_name_prefix="slot") as pool:
        outcomes = [f.result() for f in [pool.submit(loop.run) for loop in loops]]
    outcome = outcomes[0]
    outcome.requeued = requeued
    if any(o.stopped == INTERRUPTED for o in outcomes):
        outcome.stopped = INTERRUPTED
    elif any(o.stopped == EXHAUSTED for o in outcomes):
        outcome.stopped = EXHAUSTED
    return outcome


class _SharedPolicy:
    """The run's turn policy; a decision taken under the study lock is replayed to StudyLoop._take_turn."""

    def __init__(self, inner):
        self.inner = inner
        self.decided: str | None = None

    def next(self, history: list[TrialRecord], available: list[str]) -> str:
        if self.decided is not None:
            name, self.decided = self.decided, None
            return name
        return self.inner.next(history, available)

    def describe(self) -> str:
        return self.inner.describe()


def confirmed_count(history: list[TrialRecord], w: TrialRecord) -> int:
    """How many re-measurements confirmed the winner (passed the gate, within tolerance)."""
    return sum(1 for c in confirmations(history, w.number) if c.confirmed)


def told(state: TrialState, value: float | None, violation: float) -> tuple[TrialState, float | None]:
    """The state and value a finished trial is told with. A trial that is infeasible or failed (violation > 0) is
    told PRUNED without a value, its constraint saying why: TPE ranks it after every feasible trial by that
    constraint (as it did when it was told 0), GP is shown it as before (ConstrainedGPSampler), and the dashboard's
    history plot leaves it out instead of drawing it at 0. A measured value is rounded to TOLD_DIGITS."""
    if violation > 0:
        return TrialState.PRUNED, None
    return state, (round(value, TOLD_DIGITS) if value is not None else None)


def measurement_attrs(m: Measurement) -> dict:
    """The trial attributes of a measurement: the whole of it as one attribute, and beside it the scalars a person
    reads in optuna-dashboard (search.storing.schema)."""
    return {
        schema.STATUS: m.status, schema.REASON: m.reason, schema.GEOMEAN_TFLOPS: m.geomean_tflops(),
        schema.TFLOPS: {r.problem: r.tflops for r in m.results if r.tflops is not None},
        schema.DEVICE: m.device, schema.MODE: m.mode, schema.MEASUREMENT: m.to_dict(),
        **({schema.OCCUPANCY: emulated_occupancy.regime()} if m.mode == "emulated" else {}),
    }
