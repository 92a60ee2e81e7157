"""TPE given the study's spec proposes configs the static rules accept (search.proposing.samplers.FeasibleTPESampler).

Measured on the CPU in docs/measurements/2026-12-06-tpe-constraints.md: on causal backward spaces plain TPE, told
refusals as the loop tells them, proposed refused configs for about half of 60 asks (all of them on some seeds).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState
from search_helpers import spec

from search.proposing.samplers import FeasibleTPESampler, make_sampler
from search.running.loop import told
from search.storing import schema
from search.storing.history import config_key

ASKS = 24


def _asked(sampler, s, asks: int = ASKS) -> tuple[int, int]:
    """(refused proposals, distinct feasible configs) in `asks` asks, each trial told as search.running.loop tells
    it: a refused config PRUNED with its feasibility constraint, a feasible one a deterministic value (its shared
    memory, a stand-in for TFLOPS) with constraint 0."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space, pc = s.space, s.problem_class
    study = optuna.create_study(direction="maximize", sampler=sampler)
    distributions = space.distributions()
    refused, feasible = 0, set()
    for _ in range(asks):
        trial = study.ask(distributions)
        config = space.config(trial.params)
        verdict = space.check(config, pc, s.target)
        violation = space.violation(config, pc, s.target, verdict)
        if verdict:
            feasible.add(config_key(config.to_dict()))
        else:
            refused += 1
        trial.set_constraint(schema.CONSTRAINT_KEY, violation)
        state, value = told(TrialState.COMPLETE, space.smem_bytes(config, pc)[0] / 1000.0, violation)
        study.tell(trial, value, state=state)
    return refused, len(feasible)


def test_tpe_with_the_spec_proposes_feasible_causal_backward_configs_where_plain_tpe_is_refused():
    s = spec("bwd", "d128-causal-gqa4-bf16")
    sampler = make_sampler("tpe", 0, s)
    assert isinstance(sampler, FeasibleTPESampler)
    new_refused, new_feasible = _asked(sampler, s)
    old_refused, old_feasible = _asked(make_sampler("tpe", 0), s)  # no spec: Optuna's TPESampler, as before
    assert new_refused == 0
    assert old_refused >= ASKS // 3 and new_refused < old_refused
    assert new_feasible >= ASKS - 4 and new_feasible > old_feasible


def test_asks_before_any_trial_finished_are_feasible():
    """A run's first asks come while its slots are all in flight: no trial has finished, TPE has no joint space, and
    it drew each knob apart, outside the feasible configs (on the H100, 2026-12-06-h100-s8-edge-ut-gqa4.md, the first
    TPE trial of the GQA 4 causal study was refused for 115712 B of shared memory)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = spec("bwd", "d128-causal-gqa4-bf16")
    study = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", 0, s))
    configs = [s.space.config(study.ask(s.space.distributions()).params) for _ in range(16)]
    assert all(s.space.check(c, s.problem_class, s.target) for c in configs)
    assert len({config_key(c.to_dict()) for c in configs}) > 8
    unrestricted = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", 0))
    drawn = [s.space.config(unrestricted.ask(s.space.distributions()).params) for _ in range(16)]
    assert sum(not s.space.check(c, s.problem_class, s.target) for c in drawn) >= 8  # what the spec prevents
