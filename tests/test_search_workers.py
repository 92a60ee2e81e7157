"""Several workers on one study, on PostgreSQL and on SQLite: no config measured twice, every trial accounted
for, a worker killed with SIGKILL mid-trial and its trial recovered by the others, results.tsv whole; the turn
policy counts other workers' trials; bad input stops a worker before it writes anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import optuna
import pytest
from optuna.trial import TrialState

from fa4tune.harness import results_tsv
from search.__main__ import main as search_main
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import load_table
from search.proposing.samplers import make_sampler
from search.proposing.scripted import ScriptedProposer
from search.proposing.turns import FixedRatio
from search.running.launch import prepare_studies
from search.running.loop import LoopSettings, StopFlag
from search.running.run_config import RunConfig
from search.running.worker import WorkerLoop, spec_of
from search.storing import schema
from search.storing.claims import StudyLock, set_pending_turn
from search.storing.history import config_key, evaluated_count, records
from search.storing.storage import open_storage
from search.storing.study import open_study
from search_helpers import CLASS, ROOT, SUITE, Recorder, run_cli, spec, write_table
from pg_server import postgres  # noqa: F401  (the session's server)

STUDY = f"fwd:{CLASS}:sm120"
N_TRIALS = 12
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)  # a finished trial (an infeasible or failed one is told PRUNED)
DELAY = 0.8  # seconds per replayed config: trials of different workers overlap
# The worker that is killed measures slower, so that the test's poll (a storage query, slow on a loaded 2-core CI
# machine) finds it inside a trial: with 0.8 s trials the 0.4 s window was missed under load. It runs alone until
# it is killed: with the others running, its proposals after its first measurement could all be infeasible or
# duplicates (over in milliseconds) until the others finished the study, and the kill never came (a CI failure).
KILLED_DELAY = 3.0
KILL_WINDOW = (0.5, KILLED_DELAY / 2)  # seconds into a trial: a trial that is not measured has ended by 0.5 s


def _settings(url: str, table, **extra) -> RunConfig:
    settings = dict(storage=url, suite=SUITE, directions=["fwd"], problem_classes=[CLASS], evaluator="replay", table=str(table),
                    proposer="none", n_trials=N_TRIALS, confirmations=1, results="")
    return RunConfig(**{**settings, **extra})


def _worker(url: str, table, results, name: str, delay: float = DELAY) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    return subprocess.Popen(
        [sys.executable, "-m", "search", "worker", "--storage", url, "--study", STUDY, "--evaluator", "replay", "--table", str(table),
         "--replay-delay", str(delay), "--results", str(results), "--heartbeat", "1", "--grace", "3", "--worker-id", name],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _study(url: str) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=open_storage(url))


def _kill_mid_trial(url: str, proc: subprocess.Popen, name: str) -> optuna.trial.FrozenTrial:
    """SIGKILL the worker early in the measurement of a trial it claimed (after it measured one); that trial.
    The worker runs alone until then, so it goes on measuring until a poll lands inside one of its trials."""
    study = _study(url)
    deadline = time.time() + 180
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        trials = study.get_trials()
        done = [t for t in trials if t.state in FINISHED and t.user_attrs.get(schema.WORKER) == name and t.user_attrs.get(schema.EVALUATED)]
        mine = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get(schema.WORKER) == name
                and t.user_attrs.get(schema.CONFIRMATION_OF) is None]
        if done and mine and KILL_WINDOW[0] < (datetime.now() - mine[0].datetime_start).total_seconds() < KILL_WINDOW[1]:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed = study._storage.get_trial(mine[0]._trial_id)
            assert killed.state == TrialState.RUNNING, "the kill came after the trial ended"
            return killed
        time.sleep(0.02)
    raise AssertionError("the worker never claimed a trial")


def _workers_check():
    from bench_helpers import load_bench

    return load_bench("workers_check")


def _check_three_workers_one_killed(url: str, tmp_path) -> None:
    table, results = write_table(tmp_path), tmp_path / "results.tsv"
    prepare_studies(_settings(url, table), open(os.devnull, "w"))
    w0 = _worker(url, table, results, "w0", KILLED_DELAY)
    killed = _kill_mid_trial(url, w0, "w0")
    # the others find its trial running, wait out its heartbeat's grace, and requeue it
    procs = {name: _worker(url, table, results, name) for name in ("w1", "w2")}
    outputs = {}
    for name in ("w1", "w2"):
        outputs[name] = procs[name].communicate(timeout=180)[0]
        assert procs[name].returncode == 0, outputs[name]

    trials = _study(url).get_trials()
    # every trial accounted for: finished, and only the killed one failed
    assert {t.state for t in trials} <= {*FINISHED, TrialState.FAIL}
    assert [t.number for t in trials if t.state == TrialState.FAIL] == [killed.number]
    # its config was queued again and finished by another worker
    requeued = [t for t in trials if t.user_attrs.get(schema.REQUEUED_FROM) == killed.number]
    assert len(requeued) == 1 and requeued[0].params == killed.params and requeued[0].state in FINISHED
    assert requeued[0].user_attrs[schema.PROPOSER] == killed.user_attrs[schema.PROPOSER]
    assert any(f"trials {killed.number} lost their worker" in out for out in outputs.values())
    # no config measured twice (confirmations measure again on purpose), and exactly n_trials measured
    history = records(_study(url))
    measured = [config_key(r.config) for r in history if r.is_search and r.evaluated]
    assert len(measured) == len(set(measured)) == evaluated_count(history) == N_TRIALS
    assert {t.user_attrs[schema.WORKER] for t in trials if t.user_attrs.get(schema.EVALUATED)} == {"w0", "w1", "w2"}
    copies = [r for r in history if r.duplicate_of is not None]
    assert all(history[r.duplicate_of].evaluated for r in copies)
    # bench/workers_check.py (what the GPU runs report) counts the same
    counts = _workers_check().check_study(_study(url))
    assert counts["duplicate_measurements"] == 0 and counts["lost"] == [] and counts["unfinished"] == []
    assert counts["failed"] == [killed.number] and counts["requeued"] == {str(killed.number): requeued[0].number}
    assert counts["measured_search_trials"] == counts["distinct_configs"] == N_TRIALS
    # the winner was confirmed once
    confirmations = [t for t in trials if t.user_attrs.get(schema.CONFIRMATION_OF) is not None and t.state in FINISHED]
    assert confirmations and confirmations[-1].user_attrs[schema.CONFIRMED]
    # results.tsv: one whole row per finished trial, from every worker, nothing torn or interleaved
    contents = results_tsv.read_rows(results)
    assert contents.skipped == ()
    numbers = [row.config["trial"] for row in contents.rows]
    assert sorted(numbers) == sorted(t.number for t in trials if t.state in FINISHED)


@pytest.mark.postgres
def test_three_workers_on_postgresql_one_killed_mid_trial(postgres, tmp_path):  # noqa: F811
    postgres.create_database("workers_kill")
    _check_three_workers_one_killed(postgres.url(database="workers_kill"), tmp_path)


def test_three_workers_on_sqlite_one_killed_mid_trial(tmp_path):
    _check_three_workers_one_killed(f"sqlite:///{tmp_path / 'search.db'}", tmp_path)


def test_run_with_two_workers_creates_the_study_records_its_settings_and_both_measure(tmp_path):
    url, table = f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path)
    # the command in this process (its imports paid once), its two workers in processes of their own
    done = run_cli("run", "--workers", "2", "--storage", url, "--evaluator", "replay", "--table", str(table),
                   "--suite", SUITE, "--direction", "fwd", "--problem-class", CLASS, "--proposer", "none", "--n-trials", "6",
                   "--confirmations", "1", "--replay-delay", "2.0", "--results", str(tmp_path / "results.tsv"),  # 2 s a config: the slower worker to start still finds work
                   timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{STUDY}: 6 evaluated by 2 workers" in done.stdout
    study = _study(url)
    assert study.user_attrs[schema.SEARCH_SETTINGS]["n_trials"] == 6
    assert len({t.user_attrs[schema.WORKER] for t in study.trials if t.user_attrs.get(schema.EVALUATED)}) == 2
    assert results_tsv.read_rows(tmp_path / "results.tsv").skipped == ()


# ------------------------------------------------------------------------------------------------
# Turns across workers (in process: the decision, with other workers' trials in the storage).
# ------------------------------------------------------------------------------------------------


def _loop_on(url: str, table, worker_id: str) -> WorkerLoop:
    """A worker's loop on the study, with a scripted proposer in Claude's seat."""
    storage = open_storage(url)
    study = optuna.load_study(study_name=STUDY, storage=storage, sampler=make_sampler("tpe", 0))
    return WorkerLoop(study, spec_of(study, SUITE), ReplayEvaluator(load_table(str(table))), "tpe", [ScriptedProposer([], name="claude")],
                      FixedRatio({"tpe": 1.0, "claude": 1.0}), LoopSettings(n_trials=N_TRIALS, results_path=None), Recorder(), StopFlag(),
                      worker_id=worker_id, lock=StudyLock(storage, STUDY))


def test_the_turn_counts_what_other_workers_run_and_the_proposer_turns_they_are_taking(tmp_path):
    url, table = f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path)
    prepare_studies(_settings(url, table, baseline=False), open(os.devnull, "w"))
    loop = _loop_on(url, table, "me")
    for proposer in ["claude", "claude", "tpe", "tpe", "tpe"]:  # claude's 2 finished; 3 tpe trials running on other workers
        trial = loop.study.ask(loop.distributions)
        trial.set_user_attr(schema.PROPOSER, proposer)
        if proposer == "claude":
            trial.set_user_attr(schema.EVALUATED, True)
            loop.study.tell(trial, 100.0)
    history = records(loop.study)
    # counting finished trials only, tpe (0) would be behind claude (2); with the 3 running elsewhere, claude is
    assert loop.policy.inner.next(history, ["tpe", "claude"]) == "tpe"
    assert loop._decide(history, remaining=4) == "claude"
    assert loop.study.user_attrs[schema.PENDING_TURNS]["me"] == {**loop.study.user_attrs[schema.PENDING_TURNS]["me"], "proposer": "claude", "k": 4}
    set_pending_turn(loop.study, "me", None)
    # another worker is taking a claude turn of 4 configs: here it is the sampler's turn
    set_pending_turn(loop.study, "other", "claude", 4)
    assert loop._decide(records(loop.study), remaining=4) is None


# ------------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2, the study untouched.
# ------------------------------------------------------------------------------------------------


def _worker_cli(*args) -> tuple[int, str]:
    """`python -m search worker ARGS` in a fresh process: (exit code, stderr)."""
    done = subprocess.run([sys.executable, "-m", "search", "worker", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def _worker_main(capsys, *args) -> tuple[int, str]:
    """The same command in this process (faster): (exit code, stderr)."""
    capsys.readouterr()
    code = search_main(["worker", *map(str, args)])
    return code, capsys.readouterr().err


def _snapshot(url: str):
    study = _study(url)
    return study.user_attrs, [(t.number, t.state, t.params, t.user_attrs) for t in study.get_trials()]


def test_worker_refuses_an_unreachable_database(tmp_path):
    from pg_server import free_port

    code, err = _worker_cli("--storage", f"postgresql://tuner:secret@127.0.0.1:{free_port()}/search", "--study", STUDY)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "storage_unreachable" in err
    assert "secret" not in err
    code, err = _worker_cli("--storage", f"sqlite:///{tmp_path / 'missing.db'}", "--study", STUDY)
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err


@pytest.mark.postgres
def test_worker_refuses_wrong_credentials_without_touching_the_study(postgres, tmp_path, capsys):  # noqa: F811
    postgres.create_role("tuner", "right-password")
    postgres.create_database("workers_auth", owner="tuner")
    url = postgres.url("tuner", "right-password", "workers_auth")
    prepare_studies(_settings(url, write_table(tmp_path)), open(os.devnull, "w"))
    before = _snapshot(url)
    code, err = _worker_main(capsys, "--storage", postgres.url("tuner", "wrong-password", "workers_auth"), "--study", STUDY,
                            "--evaluator", "replay", "--table", write_table(tmp_path))
    assert code == 2 and err.count("\n") == 1, err
    assert "password authentication failed" in err and "wrong-password" not in err
    assert _snapshot(url) == before


def test_worker_refuses_a_study_of_another_space_an_unknown_study_and_one_without_settings(tmp_path, capsys):
    url, table = f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path)
    prepare_studies(_settings(url, table), open(os.devnull, "w"))
    _study(url).set_user_attr(schema.SPACE_SIGNATURE, "0123456789abcdef")  # as an older version of the space would have
    before = _snapshot(url)
    code, err = _worker_main(capsys, "--storage", url, "--study", STUDY, "--evaluator", "replay", "--table", table)
    assert code == 2 and err.count("\n") == 1 and "another search space" in err and "0123456789abcdef" in err
    assert _snapshot(url) == before

    code, err = _worker_main(capsys, "--storage", url, "--study", "fwd:nope:sm120", "--evaluator", "replay", "--table", table)
    assert code == 2 and "no study named 'fwd:nope:sm120'" in err and STUDY in err

    storage = open_storage(url)
    optuna.create_study(study_name="bare", storage=storage)
    code, err = _worker_main(capsys, "--storage", url, "--study", "bare", "--evaluator", "replay", "--table", table)
    assert code == 2 and err.count("\n") == 1 and "not made by fa4-tune" in err

    open_study(storage, spec("fwd", "d64-causal-bf16"), make_sampler("tpe", 0))  # as a plain `run` makes it
    code, err = _worker_main(capsys, "--storage", url, "--study", "fwd:d64-causal-bf16:sm120", "--evaluator", "replay", "--table", table)
    assert code == 2 and err.count("\n") == 1 and "no recorded search settings" in err
    assert _snapshot(url) == before


def test_one_worker_with_several_trials_in_flight_shares_the_study_between_its_slots(tmp_path):
    """The slots the compile pipeline uses (threads of one worker), here with the replay evaluator."""
    url, table = f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path)
    prepare_studies(_settings(url, table, n_trials=9), open(os.devnull, "w"))
    done = run_cli("worker", "--storage", url, "--evaluator", "replay", "--table", str(table), "--replay-delay", "0.3", "--slots", "3",
                   "--results", str(tmp_path / "results.tsv"), "--worker-id", "w", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    history = records(_study(url))
    measured = [config_key(r.config) for r in history if r.is_search and r.evaluated]
    assert len(measured) == len(set(measured)) == 9
    assert {t.user_attrs[schema.WORKER] for t in _study(url).trials if t.user_attrs.get(schema.EVALUATED)} == {"w/0", "w/1", "w/2"}
    assert len(results_tsv.read_rows(tmp_path / "results.tsv").rows) == len(history)


def test_a_replayed_run_and_its_workers_search_only_the_knob_values_the_table_measured(tmp_path):
    url, table = f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path, kernels=("sm120",))
    common = ["--storage", url, "--evaluator", "replay", "--table", str(table), "--suite", SUITE, "--direction", "fwd",
              "--problem-class", CLASS, "--proposer", "none", "--confirmations", "0", "--results", ""]
    alone = run_cli("run", *common, "--n-trials", "8")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    # kernel cut to the table's one class (of all registered: sm120, sm120_tma, experiment.py's sm120_splitkv)
    assert "space (fwd): only the knob values synthetic_table.json measured: kernel sm120 (of sm120/sm120_splitkv/sm120_tma/" in alone.stdout
    together = run_cli("run", "--workers", "2", *common, "--n-trials", "14", timeout=180)  # the same study, resumed by workers
    assert together.returncode == 0, together.stdout + together.stderr
    trials = _study(url).trials
    assert sum(bool(t.user_attrs.get(schema.EVALUATED)) for t in trials) == 14
    assert {t.params["kernel"] for t in trials} == {"sm120"}
    assert not [t for t in trials if t.user_attrs.get(schema.STATUS) == "missing"]
