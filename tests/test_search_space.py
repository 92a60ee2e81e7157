"""The Optuna view of the knobs: evenly spaced integer knobs are ordered distributions, true categories stay
categorical, and a study records which knobs are ordered (its signature changes with them)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from search.space import distribution, get_space
from search_helpers import TARGET


def test_evenly_spaced_integers_are_ordered_and_everything_else_is_categorical():
    assert distribution((64, 128, 192, 256)) == IntDistribution(64, 256, step=64)
    assert distribution((2, 1)) == IntDistribution(1, 2, step=1)
    assert distribution((32, 64, 128)) == CategoricalDistribution([32, 64, 128])  # geometric: no Optuna distribution fits
    assert distribution((False, True)) == CategoricalDistribution([False, True])  # booleans are ints to Python
    assert distribution(("sm120", "sm120_tma")) == CategoricalDistribution(["sm120", "sm120_tma"])
    assert distribution((128,)) == CategoricalDistribution([128])  # one value: nothing to order


def test_the_forward_tiles_threads_and_stages_reach_the_sampler_as_ordered_knobs():
    space = get_space("fwd")
    kinds = {name: type(d) for name, d in space.distributions().items()}
    assert {n for n, k in kinds.items() if k is IntDistribution} >= {"tile_m", "tile_n", "num_threads", "num_stages"}
    assert kinds["kernel"] is CategoricalDistribution and kinds["Q_in_regs"] is CategoricalDistribution
    assert space.describe(TARGET)["ordered"] == sorted(n for n, k in kinds.items() if k is IntDistribution)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    for _ in range(3):  # every sampled value lies on the knob's grid and maps back to a config
        trial = study.ask(space.distributions())
        config = space.config(trial.params)
        assert config.tile_m in space.domain["tile_m"] and config.tile_n in space.domain["tile_n"]
        study.tell(trial, 1.0)
    assert isinstance(study.trials[0].distributions["tile_m"], IntDistribution)


def test_a_backward_study_searches_only_its_class_feasible_knob_values():
    """The backward's rules accept ~0.05 % of its product: a study's space is cut to the values its class's feasible
    configs have, so random proposals are feasible far more often; the forward space is not cut."""
    import math

    from fa4tune.config import ProblemClass
    from search.storing.study import StudySpec

    pc = ProblemClass(128, 128, True)
    full, spec = get_space("bwd"), StudySpec("bwd", pc, (), TARGET)
    cut = spec.space
    feasible = full.feasible(pc, TARGET)
    assert len(cut.feasible(pc, TARGET)) == len(feasible) > 0
    assert math.prod(map(len, cut.domain.values())) < math.prod(map(len, full.domain.values())) / 500
    assert cut.domain["V_in_regs"] == (False,) and cut.domain["num_threads"] == (128,)
    assert all(cut.in_domain(c) == "" for c in feasible)
    assert cut.signature(TARGET) != full.signature(TARGET)
    assert StudySpec("fwd", pc, (), TARGET).space is get_space("fwd")
