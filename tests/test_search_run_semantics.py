"""What a user can trust about a run: a finished study is left alone, an exhausted space stops, n_trials counts
distinct evaluated configs, a hopeless config is pruned (Optuna's pruning API), several slots of one local run
never measure a config twice, Ctrl-C names the best so far as not confirmed."""

from __future__ import annotations

import threading

import optuna
from optuna.trial import TrialState

from fa4tune.harness import flops
from fa4tune.harness.measurement import Measurement, ProblemResult
from search.evaluating.pruning import PRUNED, make_pruner
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import load_table
from search.proposing.samplers import make_sampler
from search.proposing.turns import FixedRatio
from search.running.loop import EXHAUSTED, INTERRUPTED, LocalLock, LoopSettings, StopFlag, StudyLoop, run_study
from search.running.runner import summary
from search.storing import schema
from search.storing.history import config_key, evaluated_count, records
from search.storing.study import open_study
from search_helpers import Recorder, replay_args, run_cli, spec, write_table


def _trials(url: str):
    from search.storing.storage import open_storage

    return optuna.load_study(study_name="fwd:d128-causal-bf16:sm120", storage=open_storage(url)).get_trials()


def test_a_finished_study_run_again_is_a_no_op_that_says_so(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    args = replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "6", "--confirmations", "1")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    count = len(_trials(url))
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "finished earlier" in again.stdout and "nothing to do" in again.stdout
    assert len(_trials(url)) == count


def test_an_exhausted_space_stops_says_so_and_a_rerun_adds_no_trial(tmp_path):
    # the replayed space holds only the sm120 kernel's configs the table measured: far fewer than 300
    url = f"sqlite:///{tmp_path / 'search.db'}"
    args = replay_args(url, write_table(tmp_path, kernels=("sm120",)), "--proposer", "none", "--n-trials", "300", "--confirmations", "0")
    first = run_cli(*args, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "the space is exhausted" in first.stdout and "(space exhausted)" in first.stdout
    trials = _trials(url)
    measured = {config_key(t.user_attrs[schema.CONFIG]) for t in trials if t.user_attrs.get(schema.EVALUATED)}
    assert len(measured) == sum(1 for t in trials if t.user_attrs.get(schema.EVALUATED))  # each config measured once
    again = run_cli(*args)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert len(_trials(url)) == len(trials)


def test_n_trials_counts_distinct_evaluated_configs_and_duplicates_cost_no_budget(tmp_path):
    from search_helpers import make_loop

    loop, evaluator, _ = make_loop(write_table(tmp_path), sampler="tpe", n_trials=20, confirmations=0)
    outcome = loop.run()
    history = records(loop.study)
    evaluated = [r for r in history if r.evaluated]
    assert outcome.evaluated == len(evaluated) == 20 == len({config_key(r.config) for r in evaluated}) == len(evaluator.calls)
    assert any(r.duplicate_of is not None for r in history)  # TPE repeated itself; those trials were copies


class _SpeedModel(ReplayEvaluator):
    """Replays the table, but as the GPU evaluator does: each problem's result reported to the monitor in turn,
    a problem timed past its give-up time comes back 'pruned', and the rest are left out when the trial is pruned."""

    def __init__(self, table):
        super().__init__(table)
        self.limits: list[dict] = []

    def evaluate(self, kind, config, problem_class, problems, monitor=None):
        m = super().evaluate(kind, config, problem_class, problems)
        if monitor is None:
            return m
        self.limits.append({p.label: monitor.give_up_ms(p.label) for p in problems})
        results, stopped = [], False
        for p, r in zip(problems, m.results):
            if stopped:
                results.append(ProblemResult(p.label, kind, PRUNED, reason="not measured: pruned"))
                continue
            limit = monitor.give_up_ms(p.label)
            if r.status == "ok" and limit and flops.problem_flops(p, kind) / (r.tflops * 1e9) > limit:
                r = ProblemResult(p.label, kind, PRUNED, tflops=r.tflops, reason="stopped after 3 samples")
            results.append(r)
            stopped = not monitor.report(r)
        return Measurement(m.kind, m.problem_class, m.config, tuple(results), m.target, m.device, m.mode, m.evaluator)


def _pruning_loop(tmp_path, factor: float):
    table = write_table(tmp_path)
    study = open_study(optuna.storages.InMemoryStorage(), spec(), make_sampler("random", 3), make_pruner(factor))
    evaluator = _SpeedModel(load_table(str(table)))
    loop = StudyLoop(study, spec(), evaluator, "random", [], FixedRatio({"random": 1.0}),
                     LoopSettings(n_trials=25, confirmations=1, prune_factor=factor), Recorder(), StopFlag())
    return loop, evaluator


def test_a_config_clearly_slower_than_the_best_is_pruned_and_told_to_the_sampler_as_pruned(tmp_path):
    loop, evaluator = _pruning_loop(tmp_path, 1.3)
    outcome = loop.run()
    trials = loop.study.get_trials()
    # a PRUNED trial with a constraint > 0 is an infeasible or failed config (search.running.loop.told), not a pruned one
    pruned = [t for t in trials if t.state == TrialState.PRUNED and t.constraints[schema.CONSTRAINT_KEY] <= 0]
    assert pruned, "random sampling of this table finds configs 30 % behind the best"
    for t in pruned:
        # measured and pruned, or a copy of one (a duplicate proposal is not measured again)
        assert t.user_attrs[schema.STATUS] == PRUNED and (t.user_attrs[schema.EVALUATED] or schema.DUPLICATE_OF in t.user_attrs)
        assert t.intermediate_values and t.constraints[schema.CONSTRAINT_KEY] == 0.0  # feasible, just slow
        assert t.value is None or t.value == t.intermediate_values[max(t.intermediate_values)]
    # the baseline runs first, whole and without give-up times; after it, every trial has one per problem
    baseline = next(t for t in trials if t.user_attrs[schema.PROPOSER] == "baseline")
    assert baseline.number == 0 and baseline.state == TrialState.COMPLETE
    assert evaluator.limits and all(v for limits in evaluator.limits for v in limits.values())
    assert outcome.evaluated == 25 and outcome.confirmed and outcome.winner.status == "ok"


def test_without_pruning_nothing_is_pruned(tmp_path):
    loop, evaluator = _pruning_loop(tmp_path, 0.0)
    loop.run()
    # (an infeasible or failed config is told PRUNED too, with a constraint > 0: its status says which)
    assert not [t for t in loop.study.get_trials() if t.user_attrs.get(schema.STATUS) == PRUNED]
    assert all(v is None for limits in evaluator.limits for v in limits.values())


def test_a_duplicate_of_a_pruned_config_is_copied_as_pruned(tmp_path):
    loop, _ = _pruning_loop(tmp_path, 1.3)
    loop.run()
    pruned = next(t for t in loop.study.get_trials() if t.state == TrialState.PRUNED and t.user_attrs[schema.STATUS] == PRUNED)
    loop.study.enqueue_trial(pruned.params)
    trial = loop.study.ask(loop.distributions)
    r = loop._run_trial(trial, records(loop.study))
    assert r.state == "PRUNED" and r.duplicate_of == pruned.number and not r.evaluated


def test_the_baseline_and_the_incumbent_are_measured_whole_however_slow(tmp_path):
    """upstream's default can be 1.3x behind a transfer config measured before it (it was, on the H200: bwd d128
    non-causal, 2026-12-02); a pruned baseline would leave every winner without its "vs upstream's default"."""
    first, _ = _pruning_loop(tmp_path, 1.3)
    first.run()
    trials = first.study.get_trials()
    fast = max((t for t in trials if t.state == TrialState.COMPLETE and t.value), key=lambda t: t.value)
    slow = next(t for t in trials if t.user_attrs[schema.STATUS] == PRUNED and t.user_attrs[schema.EVALUATED])
    for proposer, state in (("transfer", "PRUNED"), ("baseline", "COMPLETE"), ("incumbent", "COMPLETE")):
        loop, evaluator = _pruning_loop(tmp_path, 1.3)
        for params, who in ((fast.params, "transfer"), (slow.params, proposer)):
            loop.study.enqueue_trial(params, user_attrs={schema.PROPOSER: who})
            r = loop._run_trial(loop.study.ask(loop.distributions), records(loop.study))
        assert r.state == state, (proposer, r.state)
        if state == "COMPLETE":
            assert r.ok and set(r.tflops) == {p.label for p in spec().problems} and r.value < fast.value / 1.3
            assert len(evaluator.limits) == 1  # only the fast config was given a monitor (give-up times)


def test_several_slots_of_one_run_share_the_study_without_measuring_a_config_twice(tmp_path):
    table = write_table(tmp_path)
    study = open_study(optuna.storages.InMemoryStorage(), spec(), make_sampler("tpe", 0))
    evaluator = ReplayEvaluator(load_table(str(table)), delay_s=0.02)
    seen_threads = set()
    original = evaluator.evaluate

    def evaluate(*args, **kwargs):
        seen_threads.add(threading.get_ident())
        return original(*args, **kwargs)

    evaluator.evaluate = evaluate
    lock, stop = LocalLock(), StopFlag()
    loops = [StudyLoop(study, spec(), evaluator, "tpe", [], FixedRatio({"tpe": 1.0}), LoopSettings(n_trials=16, confirmations=2),
                       Recorder(), stop, lock=lock, worker_id=f"local/{i}") for i in range(4)]
    outcome = run_study(loops)
    history = records(study)
    search = [r for r in history if r.evaluated and r.confirmation_of is None]
    assert len(search) == 16 == len({config_key(r.config) for r in search})
    assert outcome.confirmed and len([r for r in history if r.confirmation_of is not None]) == 2
    assert len(seen_threads) > 1  # the slots really measured side by side
    assert not [t for t in study.get_trials() if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_after_ctrl_c_the_summary_names_the_best_so_far_as_not_confirmed(tmp_path):
    from search_helpers import make_loop

    loop, _, _ = make_loop(write_table(tmp_path), n_trials=30, confirmations=2)
    original = loop._run_trial

    def stop_after_five(trial, history):
        r = original(trial, history)
        if evaluated_count(records(loop.study)) >= 5:
            loop.stop.requested = True
        return r

    loop._run_trial = stop_after_five
    outcome = loop.run()
    assert outcome.stopped == INTERRUPTED and outcome.winner is not None and not outcome.confirmed
    line = summary(outcome)
    assert "not confirmed" in line and "stopped by Ctrl-C" in line and f"#{outcome.winner.number}" in line
    assert EXHAUSTED != outcome.stopped and evaluated_count(records(loop.study)) == 5


class _FaultyGpu(ReplayEvaluator):
    """Replays the table, except that three configs end as the GPU harness ends them: a fault, a hang, a wrong result."""

    FAULTS = [("crash", "killed by signal SIGSEGV"), ("timeout", "no progress: waited 300 s; the child was killed"),
              ("incorrect", "out: max error 8.4 > tolerance 0.05")]

    def __init__(self, table):
        super().__init__(table)
        self.faulted: dict = {}

    def evaluate(self, kind, config, problem_class, problems, monitor=None):
        m = super().evaluate(kind, config, problem_class, problems)
        if len(self.faulted) < len(self.FAULTS) and len(self.calls) % 3 == 2:
            status, reason = self.FAULTS[len(self.faulted)]
            self.faulted[config_key(config.to_dict())] = status
            results = tuple(ProblemResult(r.problem, kind, status, reason=reason) for r in m.results)
            return Measurement(m.kind, m.problem_class, m.config, results, m.target, m.device, m.mode, m.evaluator)
        return m


def test_a_fault_a_hang_and_a_wrong_result_are_recorded_with_their_reasons_and_nothing_else_changes(tmp_path):
    from fa4tune.harness import results_tsv
    from search_helpers import make_loop

    table = write_table(tmp_path)
    path = tmp_path / "results.tsv"
    loop, evaluator, _ = make_loop(table, sampler="random", n_trials=12, confirmations=0, results_path=str(path),
                                   evaluator=_FaultyGpu(load_table(str(table))))
    loop.run()
    trials = loop.study.get_trials()
    clean = ReplayEvaluator(load_table(str(table)))
    for t in trials:
        key = config_key(t.user_attrs[schema.CONFIG])
        if key in evaluator.faulted and t.user_attrs[schema.EVALUATED]:
            status = evaluator.faulted[key]
            assert t.user_attrs[schema.STATUS] == status and t.user_attrs[schema.REASON] and t.constraints[schema.CONSTRAINT_KEY] == 1.0
        elif t.user_attrs[schema.EVALUATED] and t.user_attrs[schema.STATUS] == "ok":  # the others: exactly the table's numbers
            m = clean.evaluate("fwd", loop.space.config(t.params), spec().problem_class, list(spec().problems))
            assert t.user_attrs[schema.GEOMEAN_TFLOPS] == m.geomean_tflops() and t.value == round(m.geomean_tflops(), 2)
    assert len(evaluator.faulted) == 3
    rows = results_tsv.read_rows(path).rows
    assert len(rows) == len(trials) and {row.status for row in rows} >= {"crash", "timeout", "incorrect", "ok"}


class _RefusedSampler(optuna.samplers.BaseSampler):
    """A sampler stuck on one config the rules refuse (each knob's largest value): TPE did this on the causal
    backward spaces, where most of the space is refused (2026-12-06-h100-models-twins-varlen.md)."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, name, distribution):
        return distribution.choices[-1] if hasattr(distribution, "choices") else distribution.high


def test_a_sampler_stuck_on_refused_configs_gives_way_to_exploring_and_the_budget_is_spent(tmp_path):
    s = spec()
    study = open_study(optuna.storages.InMemoryStorage(), s, _RefusedSampler())
    loop = StudyLoop(study, s, ReplayEvaluator(load_table(str(write_table(tmp_path)))), "tpe", [], FixedRatio({"tpe": 1.0}),
                     LoopSettings(n_trials=8, confirmations=0, max_stall=12, results_path=None), Recorder(), StopFlag())
    refused = loop.space.config({n: _RefusedSampler().sample_independent(None, None, n, d) for n, d in loop.distributions.items()})
    assert not loop.space.check(refused, s.problem_class, s.target)  # the stuck sampler's config is infeasible
    outcome = loop.run()
    history = records(loop.study)
    assert outcome.evaluated == 8 == evaluated_count(history)  # not stopped by the stall rule
    proposers = [r.proposer for r in history if r.evaluated]
    assert "explore" in proposers and all(p in ("baseline", "explore", "tpe", "transfer", "incumbent") for p in proposers)
    infeasible_runs = max(len(run) for run in "".join("x" if r.status == "infeasible" else "." for r in history).split("."))
    assert infeasible_runs <= 2  # at most max_repeats refused proposals before an explore turn
