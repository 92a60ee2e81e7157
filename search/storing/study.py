"""Study layout: one Optuna study per (direction, problem class, target), named e.g. fwd:d128-causal-bf16:sm120.

Each study stores its space signature and its problems; a run refuses a study that exists with
another space or other problems. On start, trials that a killed run left RUNNING are closed as FAIL
and enqueued again with the same params and proposer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import optuna
from optuna.trial import FrozenTrial, TrialState

from fa4tune import emulated_occupancy
from fa4tune.config import ConfigError, Problem, ProblemClass
from fa4tune.targets import Target
from search.space import Space, get_space
from search.storing import schema

OBJECTIVE = ("geometric mean of TFLOPS over the problems (maximize; told rounded to 0.01, exact in geomean_tflops); "
             "infeasible or failed configs are told PRUNED without a value, with a constraint > 0")
# Attributes a proposer sets when it enqueues; a requeued trial keeps them.
BASELINE = "baseline"  # the proposer name of the enqueued upstream default
INCUMBENT = "incumbent"  # the proposer name of the enqueued dispatch-table entry, where it is not upstream's default
TRANSFER = "transfer"  # the proposer name of the enqueued configs that did best on a recorded table's other classes
PROPOSER_ATTRS = (schema.PROPOSER, schema.RATIONALE, schema.CONFIRMATION_OF)

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass(frozen=True)
class StudySpec:
    """What one study tunes: a direction's knobs for one problem class on one target."""

    direction: str
    problem_class: ProblemClass
    problems: tuple[Problem, ...]
    target: Target
    space_override: Space | None = None  # a narrower space (the bench: the knob values a table covers)
    incumbent: dict | None = None  # experiment.py's dispatch entry for the class (search run on the GPU sets it)
    transfer: tuple = ()  # config dicts that did best on a table's other classes (search.proposing.transfer), tried next

    @property
    def space(self) -> Space:
        """The direction's space (or the override), cut to this problem class where the space is per_class."""
        return (self.space_override or get_space(self.direction)).for_class(self.problem_class, self.target)

    @property
    def name(self) -> str:
        return study_name(self.direction, self.problem_class, self.target)

    def labels(self) -> list[str]:
        return [p.label for p in self.problems]

    def user_attrs(self) -> dict:
        """The study's own attributes (see search.storing.schema)."""
        return {
            schema.DIRECTION: self.direction,
            schema.PROBLEM_CLASS: self.problem_class.name,
            schema.TARGET: self.target.name,
            schema.SPACE_SIGNATURE: self.space.signature(self.target),
            schema.SPACE: self.space.describe(self.target),
            schema.PROBLEMS: self.labels(),
            schema.OBJECTIVE: OBJECTIVE,
        }


def study_name(direction: str, problem_class: ProblemClass, target: Target) -> str:
    """e.g. 'fwd:d128-causal-bf16:sm120'."""
    return f"{direction}:{problem_class.name}:{target.name}"


def specs_for(problems: list[Problem], directions: list[str], target: Target, classes: list[str] | None = None) -> list[StudySpec]:
    """One spec per direction and problem class of the problems (backward: problems that need a backward)."""
    specs = []
    for direction in directions:
        get_space(direction)
        chosen = [p for p in problems if direction == "fwd" or p.backward]
        by_class: dict[str, list[Problem]] = {}
        for p in chosen:
            by_class.setdefault(p.problem_class.name, []).append(p)
        for name, members in by_class.items():
            if classes and name not in classes:
                continue
            specs.append(StudySpec(direction, members[0].problem_class, tuple(members), target))
    if classes:
        unknown = sorted(set(classes) - {s.problem_class.name for s in specs})
        if unknown:
            have = sorted({p.problem_class.name for p in problems if any(d == "fwd" or p.backward for d in directions)})
            raise ConfigError("problem_class", f"problem class {unknown[0]!r} has no problems in the suite for {', '.join(directions)} "
                                               f"(classes: {', '.join(have) or 'none'})")
    return specs


def check_existing(storage, specs: list[StudySpec], occupancy: str = "") -> list[StudySpec]:
    """Reads only: refuses a study that exists with another space or other problems, or (with `occupancy`, the
    CTAs per SM this run's emulated measurements run at: fa4tune.emulated_occupancy.regime()) whose emulated
    trials ran at another occupancy: their numbers and this run's would not compare. Returns the specs, a stored
    study's with the space it was made with (search.space.Space.stored: one stored before its class's space left out
    the kernel classes that do not serve its regime keeps them)."""
    existing = set(optuna.study.get_all_study_names(storage))
    out = []
    for spec in specs:
        if spec.name not in existing:
            out.append(spec)
            continue
        stored = optuna.load_study(study_name=spec.name, storage=storage).user_attrs
        whole = spec.space_override or get_space(spec.direction)
        space = whole.stored(stored.get(schema.SPACE_SIGNATURE), spec.problem_class, spec.target)
        if space is None:
            raise ConfigError(
                "study_space",
                f"study {spec.name!r} exists with another search space (signature {stored.get(schema.SPACE_SIGNATURE)}, "
                f"this run's is {spec.space.signature(spec.target)}); use another --storage or delete the study",
            )
        out.append(spec if space is spec.space else replace(spec, space_override=space))
        if stored.get(schema.PROBLEMS) != spec.labels():
            raise ConfigError(
                "study_problems",
                f"study {spec.name!r} was measured on other problems ({', '.join(stored.get(schema.PROBLEMS) or [])}); "
                f"this run has {', '.join(spec.labels())}",
            )
        if occupancy:
            _check_occupancy(storage, spec.name, occupancy)
    return out


def _check_occupancy(storage, name: str, occupancy: str) -> None:
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    ran = {t.user_attrs.get(schema.OCCUPANCY, emulated_occupancy.DEVICE) for t in trials
           if t.user_attrs.get(schema.EVALUATED) and t.user_attrs.get(schema.MODE) == "emulated"}
    other = sorted(ran - {occupancy})
    if other:
        turn = ("set FA4TUNE_EMULATE_OCCUPANCY=0 to continue it as it was measured" if occupancy == emulated_occupancy.TARGET
                else "leave FA4TUNE_EMULATE_OCCUPANCY unset to continue it as it was measured")
        raise ConfigError(
            "study_occupancy",
            f"study {name!r} was measured in emulation at {' and '.join(OCCUPANCY_WORDS.get(o, repr(o)) for o in other)}; this run "
            f"measures at {OCCUPANCY_WORDS[occupancy]}; use another --storage, or {turn}",
        )


OCCUPANCY_WORDS = {emulated_occupancy.TARGET: "the target's CTAs per SM (launches padded)",
                   emulated_occupancy.DEVICE: "the emulating GPU's own CTAs per SM"}


def open_study(storage, spec: StudySpec, sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    """Creates the study (and its attributes) or loads it; call check_existing first. The attributes are computed
    before the study is created, so that a space that cannot be described leaves no empty study behind."""
    attrs = spec.user_attrs()
    study = optuna.create_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner or optuna.pruners.NopPruner(),
                                direction="maximize", load_if_exists=True)
    if schema.SPACE_SIGNATURE not in study.user_attrs:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    name_metric(study, spec.direction)
    return study


def metric_name(direction: str) -> str:
    """The objective's name, which optuna-dashboard puts on its plots' value axis (else "Objective 0")."""
    return f"{direction} TFLOPS (geomean)"


def name_metric(study: optuna.Study, direction: str) -> bool:
    """Names the study's objective (Study.set_metric_names) unless it already has that name; whether it wrote."""
    wanted = [metric_name(direction)]
    if study.metric_names == wanted:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # experimental since Optuna 3.2, stable since
        study.set_metric_names(wanted)
    return True


def enqueue_baseline(study: optuna.Study, spec: StudySpec) -> bool:
    """A new study starts with upstream's default config (where the class's domain holds it): the baseline every
    winner is compared with; then, where the dispatch table holds another config (spec.incumbent), that one, so
    that a winner is known to beat what users run today (`search apply` refuses to replace an entry its study never
    measured); then the transfer configs (spec.transfer: the best of a recorded table's other classes) not already
    queued."""
    if study.get_trials(deepcopy=False):
        return False
    upstream = spec.space.upstream(spec.problem_class)
    queued = [upstream]
    # upstream's default outside the class's domain (an opt-in FP8 class draws `sm120_fp8` only, and upstream has
    # no FP8 path) has no baseline trial: Optuna's ask raises ValueError on such a fixed param, and upstream
    # cannot run the class's problems anyway; the incumbent (the FP8 default where no entry exists) leads instead
    if not spec.space.in_domain(upstream):
        study.enqueue_trial(spec.space.params(upstream), user_attrs={schema.PROPOSER: BASELINE})
    if spec.incumbent is not None:
        incumbent = spec.space.config(spec.incumbent)
        # an entry on a kernel class the search does not draw (`searched = False`) is outside the trials' distributions:
        # a trial fixed to it could not even be asked for (search.running.runner._incumbents says so)
        if incumbent not in queued and not spec.space.in_domain(incumbent):
            study.enqueue_trial(spec.space.params(incumbent), user_attrs={schema.PROPOSER: INCUMBENT})
            queued.append(incumbent)
    for values in spec.transfer:
        config = spec.space.config(values)
        if config not in queued:
            study.enqueue_trial(spec.space.params(config), user_attrs={
                schema.PROPOSER: TRANSFER, schema.RATIONALE: "among the fastest on the recorded table's other problem classes"})
            queued.append(config)
    return True


def close_interrupted(study: optuna.Study) -> list[int]:
    """Closes trials left RUNNING by a killed run as FAIL and enqueues their params again; their numbers."""
    closed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        requeue(study, trial)
        closed.append(trial.number)
    return closed


def requeue_params(trial: FrozenTrial) -> dict:
    """The params a killed trial is queued again with: those it was enqueued with (a proposer's full config,
    even when the kill came before every param was suggested), then those it had suggested."""
    return {**trial.params, **trial.system_attrs.get(schema.FIXED_PARAMS, {})}


def requeue(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Enqueues a killed trial's params again with its proposer's attributes and `requeued_from`.
    A trial killed before it had any param (nothing was evaluated) is not queued again."""
    params = requeue_params(trial)
    if not params:
        return False
    kept = {k: trial.user_attrs[k] for k in PROPOSER_ATTRS if k in trial.user_attrs}
    study.enqueue_trial(params, user_attrs={**kept, schema.REQUEUED_FROM: trial.number})
    return True


def waiting(study: optuna.Study) -> list:
    """Enqueued trials that no run has started yet."""
    return study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
