"""The sweep sampler (`search run --sampler sweep`): every feasible config of the class once, in a seeded order,
never one that another trial holds, stopped as exhausted; cut short and resumed it goes on where it stopped."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from fa4tune.config import ConfigError
from search.proposing.samplers import SweepSampler, make_sampler
from search.storing import schema
from search.storing.history import config_key
from search.storing.study import open_study
from search_helpers import make_loop, replay_args, run_cli, spec, write_table

STUDY = "fwd:d128-causal-bf16:sm120"


def _trials(url: str):
    return optuna.load_study(study_name=STUDY, storage=url).get_trials()


def _evaluated(trials) -> list[tuple]:
    return [config_key(t.user_attrs[schema.CONFIG]) for t in trials if t.user_attrs.get(schema.EVALUATED)]


def _order(seed: int, n: int) -> list[dict]:
    """The first n configs a fresh sweep study asks for (nothing measured), as params."""
    s = spec()
    study = open_study(optuna.storages.InMemoryStorage(), s, make_sampler("sweep", seed, s))
    asked = []
    for _ in range(n):
        trial = study.ask(s.space.distributions())
        asked.append(dict(trial.params))
        study.tell(trial, state=TrialState.FAIL)
    return asked


def test_the_order_is_a_seeded_shuffle_of_the_feasible_configs_each_once():
    s = spec()
    feasible = {config_key(c.to_dict()) for c in s.space.feasible(s.problem_class, s.target)}
    first = _order(0, 12)
    assert first == _order(0, 12)  # the same seed, the same order
    assert first != _order(1, 12)  # another seed, another order
    configs = [config_key(s.space.config(p).to_dict()) for p in first]
    assert len(set(configs)) == 12 and set(configs) <= feasible  # feasible only, none twice


def test_a_config_another_trial_holds_is_skipped():
    s = spec()
    study = open_study(optuna.storages.InMemoryStorage(), s, make_sampler("sweep", 0, s))
    head = _order(0, 2)
    study.enqueue_trial(head[0])  # queued by someone else (a proposer, the baseline)
    queued = study.ask(s.space.distributions())
    assert queued.params == head[0]
    nxt = study.ask(s.space.distributions())
    assert nxt.params == head[1]


def test_the_sweep_needs_the_study_and_a_feasible_config():
    with pytest.raises(ConfigError, match="the sweep sampler needs the study's space") as err:
        make_sampler("sweep", 0)
    assert err.value.rule == "sampler"
    with pytest.raises(ConfigError, match="no feasible config"):
        SweepSampler([], {})
    with pytest.raises(ConfigError, match="sampler must be one of tpe, gp, random, sweep, got 'grid'"):
        make_sampler("grid", 0)


def test_a_sweep_measures_the_whole_space_once_and_stops_as_exhausted(tmp_path):
    slots = 3  # trials in flight: each slot finds the space exhausted, the run says so once
    url = f"sqlite:///{tmp_path / 'search.db'}"
    args = replay_args(url, write_table(tmp_path, kernels=("sm120",)), "--proposer", "none", "--sampler", "sweep",
                       "--n-trials", "300", "--confirmations", "0", "--transfer-table", "", "--slots", str(slots))
    done = run_cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("stopped: the space is exhausted") == 1, done.stdout  # once, not once per slot
    trials = _trials(url)
    evaluated = _evaluated(trials)
    assert len(evaluated) == len(set(evaluated)) > 20  # each config measured once
    swept = [t for t in trials if t.user_attrs.get(schema.PROPOSER) == "sweep"]
    assert all(t.user_attrs.get("status") != "infeasible" for t in swept)  # the sweep draws feasible configs only
    # the few trials beyond the space are the ones that found it exhausted (duplicates: no budget, nothing measured),
    # a few per slot
    beyond = [t for t in trials if not t.user_attrs.get(schema.EVALUATED)]
    assert len(beyond) <= 3 * slots and all(t.user_attrs.get(schema.DUPLICATE_OF) is not None for t in beyond), \
        [(t.number, t.user_attrs.get("status")) for t in beyond]


def test_a_sweep_cut_short_resumes_with_the_configs_it_has_not_measured(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    table = write_table(tmp_path, kernels=("sm120",))
    common = ("--proposer", "none", "--sampler", "sweep", "--confirmations", "0", "--transfer-table", "")
    first = run_cli(*replay_args(url, table, *common, "--n-trials", "5"))
    assert first.returncode == 0, first.stderr
    before = _evaluated(_trials(url))
    assert len(before) == 5
    second = run_cli(*replay_args(url, table, *common, "--n-trials", "12"))
    assert second.returncode == 0, second.stderr
    after = _evaluated(_trials(url))
    assert len(after) == len(set(after)) == 12 and after[:5] == before


def test_the_loop_with_the_sweep_and_a_proposer_never_measures_a_config_twice(tmp_path):
    from search.proposing.scripted import ScriptedProposer

    s = spec()
    head = [s.space.config(p).to_dict() for p in _order(0, 3)]  # the proposer offers what the sweep would draw next
    loop, evaluator, view = make_loop(write_table(tmp_path), sampler="sweep", proposers=[ScriptedProposer(head, "scripted")],
                                      n_trials=10, k=3, confirmations=0)
    loop.run()
    configs = [config_key(c) for _, _, c in evaluator.calls]
    assert len(configs) == len(set(configs)) == 10
