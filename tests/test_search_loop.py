"""The study loop on a replayed SYNTHETIC table: feasibility before the evaluator, constraints, duplicates,
missing configs, confirmation of the winner, results.tsv rows."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from fa4tune.config import ForwardConfig
from fa4tune.feasibility import check_forward
from fa4tune.harness import results_tsv
from fa4tune.harness.measurement import Measurement, ProblemResult
from search.evaluating.replay import MISSING, ReplayEvaluator
from search.evaluating.table import load_table
from search.proposing.proposer import Proposal, Proposer
from search.storing import schema
from search.storing.history import records
from search_helpers import ROOT, TARGET, make_loop, spec, write_table


def test_an_infeasible_config_never_reaches_the_evaluator_and_is_told_as_a_constraint(tmp_path):
    loop, evaluator, view = make_loop(write_table(tmp_path), sampler="random", n_trials=15, confirmations=0)
    loop.run()
    trials = loop.study.get_trials()
    infeasible = [t for t in trials if t.user_attrs[schema.STATUS] == "infeasible"]
    assert infeasible, "random sampling of this domain proposes infeasible configs"
    for t in infeasible:
        # PRUNED without a value and with a positive constraint: TPE and GP both read it (FAIL would be ignored), and the
        # dashboard's history plot leaves it out (a value of 0 flattened it)
        assert t.state == TrialState.PRUNED and t.value is None
        assert t.constraints[schema.CONSTRAINT_KEY] > 0 and t.user_attrs[schema.CONSTRAINT][0] > 0
        assert t.user_attrs[schema.RULE] and not t.user_attrs[schema.EVALUATED]
    pc = spec().problem_class
    assert all(check_forward(ForwardConfig.from_dict(c), pc, TARGET) for _, _, c in evaluator.calls)
    assert len(evaluator.calls) == sum(t.user_attrs[schema.EVALUATED] for t in trials) == 15


def test_gp_is_shown_infeasible_trials_as_complete_with_the_penalty(tmp_path):
    from search.proposing.samplers import PENALTY, _InfeasibleAsComplete

    loop, _, _ = make_loop(write_table(tmp_path), sampler="random", n_trials=15, confirmations=0)
    loop.run()
    pruned = {t.number for t in loop.study.get_trials(states=(TrialState.PRUNED,)) if t.constraints[schema.CONSTRAINT_KEY] > 0}
    assert pruned
    shown = _InfeasibleAsComplete(loop.study)._get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    complete = {t.number for t in loop.study.get_trials(states=(TrialState.COMPLETE,))}
    assert {t.number for t in shown} == complete | pruned  # what GPSampler fits its objective and constraint models on
    assert all(t.value == PENALTY for t in shown if t.number in pruned)
    assert loop.study.trials[min(pruned)].state == TrialState.PRUNED  # the study itself is unchanged


def test_shared_memory_overflow_is_graded_so_the_sampler_sees_the_boundary(tmp_path):
    loop, _, _ = make_loop(write_table(tmp_path), sampler="random", n_trials=15, confirmations=0)
    loop.run()
    smem = [t.constraints[schema.CONSTRAINT_KEY] for t in loop.study.get_trials() if t.user_attrs.get(schema.RULE) == "smem_capacity"]
    assert smem and all(0 < v < 1 for v in smem) and len(set(smem)) > 1


def test_a_config_the_sampler_proposes_again_is_not_measured_again(tmp_path):
    loop, evaluator, _ = make_loop(write_table(tmp_path), sampler="tpe", n_trials=15, confirmations=0)
    loop.run()
    duplicates = [t for t in loop.study.trials if schema.DUPLICATE_OF in t.user_attrs]
    assert duplicates, "TPE re-proposes good configs of a small categorical space"
    configs = [tuple(sorted(c.items())) for _, _, c in evaluator.calls]
    assert len(configs) == len(set(configs))
    for t in duplicates:
        original = loop.study.trials[t.user_attrs[schema.DUPLICATE_OF]]
        # the same config (a knob of another kernel class may differ in the params: the config drops it)
        assert loop.spec.space.config(t.params) == loop.spec.space.config(original.params)
        assert t.value == original.value and not t.user_attrs[schema.EVALUATED]


class _Repeater(Proposer):
    name = "repeater"

    def __init__(self):
        self.rejections = []

    def propose(self, context):
        return [Proposal(ForwardConfig().to_dict(), "upstream again")]

    def feedback(self, rejections):
        self.rejections.extend(rejections)


def test_a_proposal_of_a_measured_config_is_rejected_before_enqueueing(tmp_path):
    proposer = _Repeater()
    loop, evaluator, view = make_loop(write_table(tmp_path), proposers=[proposer], n_trials=4, confirmations=0)
    loop.run()
    assert [c for _, _, c in evaluator.calls].count(ForwardConfig().to_dict()) == 1  # the baseline only
    assert proposer.rejections and all("already measured in trial #0" in r.reason for r in proposer.rejections)
    assert loop.study.user_attrs[schema.REJECTED_PROPOSALS]["repeater"] == len(proposer.rejections)
    assert not any(t.user_attrs[schema.PROPOSER] == "repeater" for t in loop.study.trials)


def test_a_config_missing_from_the_table_is_counted_as_missing(tmp_path):
    table = write_table(tmp_path, drop=30, kernels=("sm120", "sm120_tma"))
    loop, evaluator, view = make_loop(table, sampler="random", n_trials=30, confirmations=0)
    loop.run()
    missing = [r for r in records(loop.study) if r.status == MISSING and r.duplicate_of is None]
    assert missing and all("missing from table" in r.reason for r in missing)
    assert all(t.constraints[schema.CONSTRAINT_KEY] == 1.0 for t in loop.study.get_trials() if t.user_attrs[schema.STATUS] == MISSING)


def test_the_winner_is_confirmed_twice_by_re_measurement(tmp_path):
    loop, evaluator, view = make_loop(write_table(tmp_path), n_trials=10, confirmations=2)
    outcome = loop.run()
    history = records(loop.study)
    confirming = [r for r in history if r.confirmation_of is not None]
    assert outcome.confirmed and len(confirming) == 2
    assert {r.confirmation_of for r in confirming} == {outcome.winner.number}
    assert all(r.confirmed and r.config == outcome.winner.config and r.proposer == "confirmation" for r in confirming)
    assert outcome.evaluated == 10  # confirmations do not count towards n_trials


class _SlowerOnSecondLook(ReplayEvaluator):
    """Replays, except that the first config measured twice comes out 20% slower the second time."""

    def __init__(self, table):
        super().__init__(table)
        self.seen, self.victim = set(), None

    def evaluate(self, kind, config, problem_class, problems, monitor=None):
        m = super().evaluate(kind, config, problem_class, problems)
        key = config.key()
        if key in self.seen and self.victim in (None, key):
            self.victim = key
            results = tuple(ProblemResult(r.problem, r.direction, r.status, tflops=r.tflops * 0.8) for r in m.results)
            return Measurement(m.kind, m.problem_class, m.config, results, m.target, m.device, m.mode, m.evaluator)
        self.seen.add(key)
        return m


def test_a_winner_that_does_not_reproduce_is_refuted_and_the_next_best_confirmed(tmp_path):
    table = write_table(tmp_path)
    loop, evaluator, _ = make_loop(table, n_trials=10, confirmations=2, evaluator=_SlowerOnSecondLook(load_table(str(table))))
    outcome = loop.run()
    history = records(loop.study)
    refuted = [r for r in history if r.confirmation_of is not None and not r.confirmed]
    assert len(refuted) == 1
    assert outcome.confirmed and outcome.winner.number != refuted[0].confirmation_of
    first = next(r for r in history if r.number == refuted[0].confirmation_of)
    assert outcome.winner.value < first.value


def test_every_trial_appends_a_results_tsv_row(tmp_path):
    path = tmp_path / "results.tsv"
    loop, _, _ = make_loop(write_table(tmp_path), sampler="random", n_trials=5, confirmations=1, results_path=str(path), git_commit="abc1234")
    loop.run()
    rows = results_tsv.read_rows(path).rows
    trials = loop.study.get_trials()
    assert len(rows) == len(trials)
    by_trial = {row.config["trial"]: row for row in rows}
    for t in trials:
        row = by_trial[t.number]
        assert row.proposer == t.user_attrs[schema.PROPOSER] and row.commit == "abc1234" and row.status == t.user_attrs[schema.STATUS]
        assert row.config["forward"]["d128-causal-bf16"] == t.user_attrs[schema.CONFIG]
        if t.user_attrs[schema.STATUS] == "ok":
            assert abs(row.fwd_tflops_geomean - t.value) < 1e-9
        else:
            assert row.fwd_tflops_geomean is None


def test_trials_record_per_problem_tflops_device_mode_and_commit(tmp_path):
    loop, _, _ = make_loop(write_table(tmp_path), n_trials=2, confirmations=0, git_commit="abc1234")
    loop.run()
    baseline = loop.study.trials[0]
    a = baseline.user_attrs
    assert a[schema.PROPOSER] == "baseline" and a[schema.STATUS] == "ok" and a[schema.MODE] == "replay"
    assert set(a[schema.TFLOPS]) == {p.label for p in spec().problems}
    assert a[schema.GIT_COMMIT] == "abc1234" and "replayed from" in a[schema.DEVICE]
    assert a[schema.CONFIG] == ForwardConfig().to_dict()


def test_an_evaluated_trial_stores_its_whole_measurement_as_one_attribute_beside_the_scalars(tmp_path):
    loop, evaluator, _ = make_loop(write_table(tmp_path), n_trials=2, confirmations=0)
    loop.run()
    a = loop.study.trials[0].user_attrs
    m = Measurement.from_dict(a[schema.MEASUREMENT])
    expected = evaluator.evaluate("fwd", ForwardConfig(), spec().problem_class, list(spec().problems))
    assert m == expected  # per-problem times and the gate's errors included
    assert all(r.max_errors for r in m.results) and m.evaluator == "replay"
    assert a[schema.STATUS] == m.status and a[schema.GEOMEAN_TFLOPS] == m.geomean_tflops() and a[schema.DEVICE] == m.device
    assert not set(schema.LEGACY_TRIAL_ATTRS) & set(a)  # the measurement holds what these held
    r = records(loop.study)[0]
    assert r.results == m.results and r.evaluator == "replay" and r.static == m.static


def test_an_evaluator_that_raises_gives_a_crash_trial_and_the_study_goes_on(tmp_path):
    class Flaky(ReplayEvaluator):
        def evaluate(self, kind, config, problem_class, problems, monitor=None):
            if len(self.calls) == 1:
                self.calls.append(None)
                raise RuntimeError("CUDA error: an illegal memory access")
            return super().evaluate(kind, config, problem_class, problems)

    table = write_table(tmp_path)
    loop, _, _ = make_loop(table, n_trials=4, confirmations=0, evaluator=Flaky(load_table(str(table))))
    outcome = loop.run()
    statuses = [t.user_attrs[schema.STATUS] for t in loop.study.trials]
    assert "crash" in statuses and outcome.evaluated == 4
    crash = next(t for t in loop.study.trials if t.user_attrs[schema.STATUS] == "crash")
    assert "illegal memory access" in crash.user_attrs[schema.REASON] and crash.constraints[schema.CONSTRAINT_KEY] == 1.0


def test_the_commit_a_run_records_is_fa4tunes_whatever_the_working_directory(tmp_path, monkeypatch):
    import re
    import subprocess

    from search.running.runner import git_commit

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(tmp_path)  # not a git checkout
    commit = git_commit()
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", commit) and commit.split("-")[0] == head  # prepare.py's suffix


class _SplitCounts:
    """Measures a split-KV config by its split count: fixed 2.0 TFLOPS, the heuristic's (0) 4.0, any other config 1.0;
    `missing`: the heuristic's configs come back as a replay's missing ones (never evaluated)."""

    def __init__(self, missing=False):
        self.calls, self.missing = [], missing

    def evaluate(self, kind, config, problem_class, problems, monitor=None):
        self.calls.append(config)
        splits = config.extra_knobs.get("num_splits") if config.kernel == "sm120_splitkv" else None
        if self.missing and splits == 0:
            return Measurement(kind, problem_class.name, config.to_dict(),
                               tuple(ProblemResult(p.label, kind, MISSING, reason="missing from table") for p in problems),
                               TARGET.name, "test", "replay", "replay")
        results = tuple(ProblemResult(p.label, kind, "ok", tflops={None: 1.0, 0: 4.0}.get(splits, 2.0), ms_median=1.0)
                        for p in problems)
        return Measurement(kind, problem_class.name, config.to_dict(), results, TARGET.name, "test", "emulated")


def _decode_loop(evaluator, transfer):
    from fa4tune.config import Problem
    from search.proposing.samplers import make_sampler
    from search.proposing.turns import FixedRatio
    from search.running.loop import LoopSettings, StopFlag, StudyLoop
    from search.storing.study import StudySpec, open_study
    from search_helpers import Recorder

    problem = Problem(8, 1, 8192, 32, 8, 128, 128, False, "bf16", backward=False)
    s = StudySpec("fwd", problem.problem_class, (problem,), TARGET, transfer=(transfer,))
    study = open_study(optuna.storages.InMemoryStorage(), s, make_sampler("random", 0, s))
    settings = LoopSettings(n_trials=2, confirmations=2, results_path=None)
    return StudyLoop(study, s, evaluator, "random", [], FixedRatio({"random": 1.0}), settings, Recorder(), StopFlag())


FIXED_SPLIT = {"tile_m": 16, "tile_n": 32, "num_threads": 32, "num_stages": 1, "Q_in_regs": True, "kernel": "sm120_splitkv",
               "num_splits": 1}


def test_a_winner_that_fixes_its_split_count_meets_its_tiles_with_the_heuristics_count_before_confirmation():
    # a fixed count is measured on the suite's shapes alone (2026-12-07-h100-s16 section 6: one split won a study at
    # 16 sequences and ran 2.4x upstream at one, the same tiles split by the heuristic 17.7x)
    evaluator = _SplitCounts()
    loop = _decode_loop(evaluator, FIXED_SPLIT)
    outcome = loop.run()
    history = records(loop.study)
    twins = [r for r in history if r.proposer == "split-twin"]
    assert len(twins) == 1 and twins[0].config == {**FIXED_SPLIT, "num_splits": 0} and twins[0].evaluated
    assert "heuristic's split count" in twins[0].rationale
    assert outcome.winner.number == twins[0].number and outcome.confirmed  # the twin won, and is the one confirmed
    assert [c.extra_knobs.get("num_splits") for c in evaluator.calls if c.kernel == "sm120_splitkv"] == [1, 0, 0, 0]


def test_a_heuristic_winner_or_a_twin_missing_from_a_replay_adds_no_endless_trials():
    heuristic = _decode_loop(_SplitCounts(), {**FIXED_SPLIT, "num_splits": 0})
    assert heuristic.run().confirmed and not any(r.proposer == "split-twin" for r in records(heuristic.study))
    missing = _SplitCounts(missing=True)
    loop = _decode_loop(missing, FIXED_SPLIT)
    outcome = loop.run()
    twins = [r for r in records(loop.study) if r.proposer == "split-twin"]
    assert len(twins) == 1 and twins[0].status == MISSING  # tried once, then the fixed count is confirmed as before
    assert outcome.confirmed and outcome.winner.config == FIXED_SPLIT
