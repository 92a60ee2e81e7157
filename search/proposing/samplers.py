"""Optuna samplers by name. The model-based ones read the feasibility constraint that each trial sets.

The default is TPE, by measurement (docs/measurements/2026-11-29-search-bench.md): on the H200 forward sweep TPE and
GP tie (median 12 evaluated configs to 99% of the best, random 20.5; 9 and 10 after upstream's default as the first
trial, as `search run` does), and TPE proposes in milliseconds where GP takes about a second on a CPU.

`sweep` is exhaustive: every feasible config of the study's problem class once (search.space.Space.feasible: the
static rules decide, so nothing infeasible is drawn), in an order shuffled by the seed, so that a sweep cut short
is a uniform sample. It answers "is there any config better than this?" for a class whose feasible space is small
enough to measure whole (a few hundred configs at a few seconds each with compile-ahead).
"""

from __future__ import annotations

import copy
import random
from typing import Any, Callable, Hashable

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from fa4tune.config import ConfigError
from search.storing import schema
from search.storing.history import config_key

SAMPLERS = ("tpe", "gp", "random", "sweep")
DEFAULT_SAMPLER = "tpe"


def check_sampler(name: str) -> None:
    """A one-line error for an unknown sampler name."""
    if name not in SAMPLERS:
        raise ConfigError("sampler", f"sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")


def make_sampler(name: str, seed: int | None = None, spec=None) -> optuna.samplers.BaseSampler:
    """A fresh sampler; a one-line error for an unknown name. `sweep` needs the study's spec (its feasible configs)."""
    check_sampler(name)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        # multivariate: the knobs interact (the shared-memory rule couples tiles, stages and Q_in_regs).
        # constant_liar: trials in flight (the run's slots) count as bad guesses, so parallel asks spread out
        tpe = dict(seed=seed, multivariate=True, n_startup_trials=8, constant_liar=True)
        return FeasibleTPESampler(spec, **tpe) if spec is not None else optuna.samplers.TPESampler(**tpe)
    if name == "gp":
        return ConstrainedGPSampler(seed=seed, n_startup_trials=8, deterministic_objective=False)
    if spec is None:
        raise ConfigError("sampler", "the sweep sampler needs the study's space (a StudySpec), got none")
    space = spec.space
    points = [space.params(c) for c in space.feasible(spec.problem_class, spec.target)]
    return SweepSampler(points, space.distributions(), seed, key=lambda params: _config_of(space, params))


PENALTY = 0.0  # the objective GP is shown for an infeasible or failed trial (search.running.loop tells it PRUNED)


class _InfeasibleAsComplete:
    """A study as GPSampler reads it, where a PRUNED trial with a constraint > 0 (an infeasible or failed config:
    search.running.loop.told) is COMPLETE with the PENALTY value, as such trials were once stored."""

    def __init__(self, study: optuna.Study):
        self._study = study

    def __getattr__(self, name):
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = False, states=None, use_cache: bool = False) -> list[FrozenTrial]:
        asked = None if states is None else tuple(states)
        query = asked
        if asked is not None and TrialState.COMPLETE in asked and TrialState.PRUNED not in asked:
            query = asked + (TrialState.PRUNED,)
        found = self._study._get_trials(deepcopy=deepcopy, states=query, use_cache=use_cache)
        shown = [_as_complete(t) if t.state == TrialState.PRUNED and _infeasible(t) else t for t in found]
        return [t for t in shown if asked is None or t.state in asked]

    def get_trials(self, deepcopy: bool = True, states=None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)


def _infeasible(t: FrozenTrial) -> bool:
    return any(v > 0 for v in t.constraints.values())


def _as_complete(t: FrozenTrial) -> FrozenTrial:
    shown = copy.copy(t)
    shown.state = TrialState.COMPLETE
    shown.values = [PENALTY]
    return shown


class ConstrainedGPSampler(optuna.samplers.GPSampler):
    """Optuna's GPSampler, shown infeasible and failed trials (told PRUNED with a constraint > 0) as COMPLETE with
    the PENALTY value: its constraint model and its objective model learn from them as when they were told 0
    (GPSampler reads COMPLETE trials only; pruned trials with a constraint of 0 stay unseen, as before)."""

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return super().infer_relative_search_space(_InfeasibleAsComplete(study), trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return super().sample_relative(_InfeasibleAsComplete(study), trial, search_space)


class FeasibleTPESampler(optuna.samplers.TPESampler):
    """TPE that proposes only configs the static rules accept for the study's class (the spec's feasible configs).

    The rules are known before any trial, so TPE need not learn them from refusals: its startup draws are uniform
    over the feasible configs, its acquisition is minus infinity at refused candidates (it proposes the best feasible
    one of its candidates), and when all of them are refused it draws again (TRIES times, then a random feasible
    config). Plain TPE reads the feasibility constraint the loop stores (Optuna 5 reads trial.constraints, so a
    constraints_func changes nothing), yet on causal backward spaces it proposed refused configs for about half of 60
    asks, and for all of them when its startup drew no feasible config (docs/measurements/2026-12-06-tpe-constraints.md).
    Before any trial has finished, TPE has no joint space: the class's knobs stand for it (a random feasible config).
    One ask at a time (the loop asks under its lock): `_searching` holds the space being sampled."""

    TRIES = 16

    def __init__(self, spec, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self._keys: set | None = None  # config keys of the feasible configs (enumerated on the first proposal)
        self._points: list[dict[str, Any]] = []
        self._searching: dict[str, BaseDistribution] | None = None  # the relative search space while TPE samples it

    def _feasible_points(self) -> list[dict[str, Any]]:
        if self._keys is None:
            space = self.spec.space
            configs = space.feasible(self.spec.problem_class, self.spec.target)
            self._points = [space.params(c) for c in configs]
            self._keys = {config_key(c.to_dict()) for c in configs}
        return self._points

    def _accepted(self, params: dict[str, Any]) -> bool:
        space = self.spec.space
        full = {name: values[0] for name, values in space.domain.items() if len(values) == 1} | params
        self._feasible_points()
        return _config_of(space, full) in self._keys

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """TPE's joint space; before any trial has finished (a run's first asks, its slots all in flight) that is
        empty and TPE would draw each knob apart, unrestricted: the class's own knobs instead, so that the draw is a
        random feasible config (an H100 study's first TPE trial was refused, 2026-12-06-h100-s8-edge-ut-gqa4.md)."""
        space = super().infer_relative_search_space(study, trial)
        if space:
            return space
        return {name: d for name, d in self.spec.space.distributions().items() if not d.single()}

    def _compute_acquisition_func(self, samples, mpe_below, mpe_above):
        """TPE's acquisition, minus infinity at candidates the rules refuse (TPE proposes the best feasible one)."""
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        space = self._searching
        if space is not None and samples.keys() == space.keys():
            for i in range(len(values)):
                if not self._accepted({name: d.to_external_repr(samples[name][i]) for name, d in space.items()}):
                    values[i] = -np.inf
        return values

    def _sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self._searching = search_space
        try:
            return self._sample_feasible(study, trial, search_space)
        finally:
            self._searching = None

    def _sample_feasible(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        for _ in range(self.TRIES):
            params = super()._sample_relative(study, trial, search_space)
            if not params:  # a startup trial: uniform over the feasible configs
                break
            if self._accepted(params):
                return params
        return self._random_feasible(search_space) or params

    def _random_feasible(self, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """A uniformly drawn feasible config's params; {} when nothing is feasible (the loop then says so)."""
        points = self._feasible_points()
        if not points:
            return {}
        point = points[self._rng.rng.randint(len(points))]
        return {name: value for name, value in point.items() if name in search_space}


class SweepSampler(optuna.samplers.BaseSampler):
    """Each of `points` (trial params) once, in an order shuffled by `seed`; a point is taken once any trial of the
    study holds its config (asked, queued or finished, whoever proposed it; `key` maps params to the config they
    stand for, so that knobs another kernel class ignores do not count). When every point is taken it draws random
    points again: those are duplicates, which cost no budget, and the search loop then reports the space exhausted."""

    def __init__(self, points: list[dict[str, Any]], distributions: dict[str, BaseDistribution], seed: int | None = None,
                 key: Callable[[dict[str, Any]], Hashable] | None = None):
        if not points:
            raise ConfigError("sampler", "the sweep sampler has no feasible config to measure")
        self.points = list(points)
        random.Random(seed).shuffle(self.points)
        self.distributions = dict(distributions)
        self.key = key or (lambda params: tuple(sorted(params.items())))
        self.rng = random.Random(seed)
        self.keys: dict[int, Hashable] = {}  # trial id -> its config's key (a trial's config never changes once set)
        self.fallback = optuna.samplers.RandomSampler(seed=seed)  # a knob outside `distributions` (none in search run)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        taken = {self._key_of(t) for t in study.get_trials(deepcopy=False) if t.number != trial.number}
        point = next((p for p in self.points if self.key(p) not in taken), None)
        if point is None:  # all taken: a measured feasible config again (a duplicate, never an infeasible draw)
            point = self.rng.choice(self.points)
        return {name: value for name, value in point.items() if name in search_space}

    def _key_of(self, t: FrozenTrial) -> Hashable:
        """A trial's config key, computed once (38 us each: a sweep asks about every trial on every ask)."""
        known = self.keys.get(t._trial_id)
        if known is None:
            # a queued trial's config is in its fixed params until it is asked (as Optuna's own enqueue_trial reads it)
            params = t.system_attrs.get(schema.FIXED_PARAMS, t.params)
            known = self.key(params)
            if params:  # a trial without params yet may get them later
                self.keys[t._trial_id] = known
        return known

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self.fallback.reseed_rng()  # the sweep's order stays as the seed drew it


def _config_of(space, params: dict[str, Any]) -> Hashable:
    """The config a trial's params stand for; the params themselves where they make no config of this space."""
    try:
        return config_key(space.config(params).to_dict())
    except (ConfigError, KeyError, TypeError, ValueError):
        return tuple(sorted(params.items()))
