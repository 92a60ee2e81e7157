"""Resume: a real `python -m search run` killed with SIGKILL mid-trial, then the same command again;
Ctrl-C (SIGINT) stops after the current trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import optuna
from optuna.trial import TrialState

from fa4tune.config import ProblemClass
from search.space import get_space
from search.storing import schema
from search.storing.history import evaluated_count, records
from search.storing.storage import open_storage
from search.storing.study import close_interrupted
from search_helpers import CLASS, ROOT, TARGET, replay_args, run_cli, write_table

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)  # a finished trial (an infeasible or failed one is told PRUNED)

SPACE = get_space("fwd")

STUDY = "fwd:d128-causal-bf16:sm120"
DELAY = 1.5  # seconds per replayed config: long enough to be caught mid-trial on a loaded machine


def _start(args) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    return subprocess.Popen([sys.executable, "-m", "search", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_trials(proc: subprocess.Popen, n: int) -> list[str]:
    """Reads the plain per-trial lines until n trials were printed."""
    lines = []
    deadline = time.time() + 60
    while sum(" trial " in line for line in lines) < n:
        assert time.time() < deadline and proc.poll() is None, "".join(lines) + proc.stderr.read()
        lines.append(proc.stdout.readline())
    return lines


def _study(url):
    return optuna.load_study(study_name=STUDY, storage=open_storage(url))


def _interrupted(tmp_path, after_trials: int, signum) -> tuple[str, list, subprocess.Popen]:
    """Starts a replayed 8-trial study, and sends `signum` while the trial after `after_trials` is running."""
    url = f"sqlite:///{tmp_path / 'search.db'}"
    args = replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "8", "--confirmations", "0",
                       "--replay-delay", DELAY)
    storage = open_storage(url)  # before the run: opening it the first time takes seconds of imports
    proc = _start(args)
    _wait_for_trials(proc, after_trials)
    deadline = time.time() + 30
    # a fresh load each time: a loaded study caches its trials' states. Wait for a trial under evaluation
    # (its config recorded), not one the sampler is still filling param by param.
    # It must also have started less than half a replay delay ago: on a loaded machine a load takes long enough
    # for a trial found running to finish before the signal arrives.
    def evaluating():
        trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials()
        done = {json.dumps(t.user_attrs.get(schema.CONFIG), sort_keys=True) for t in trials if t.state in FINISHED}
        # a trial the replay really evaluates: feasible and not a duplicate (those end in milliseconds)
        return [t for t in trials if t.state == TrialState.RUNNING and schema.CONFIG in t.user_attrs
                and (datetime.now() - t.datetime_start).total_seconds() < DELAY / 2
                and json.dumps(t.user_attrs[schema.CONFIG], sort_keys=True) not in done
                and SPACE.check(SPACE.config(t.user_attrs[schema.CONFIG]), ProblemClass.parse(CLASS), TARGET)]

    while not evaluating():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signum)
    return url, args, proc


def test_kill_9_mid_study_then_the_same_command_loses_nothing_and_finishes(tmp_path):
    url, args, proc = _interrupted(tmp_path, 3, signal.SIGKILL)
    proc.wait()

    before = _study(url).get_trials()
    running = [t for t in before if t.state == TrialState.RUNNING]
    finished = {t.number: (t.params, t.value, t.user_attrs[schema.STATUS]) for t in before if t.state in FINISHED}
    assert len(running) == 1 and len(finished) >= 3

    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert f"trial {running[0].number} was left running, closed as failed and requeued" in done.stdout
    after = _study(url).get_trials()
    for number, (params, value, status) in finished.items():  # no finished trial lost or changed
        assert (after[number].params, after[number].value, after[number].user_attrs[schema.STATUS]) == (params, value, status)
    assert after[running[0].number].state == TrialState.FAIL
    requeued = [t for t in after if t.user_attrs.get(schema.REQUEUED_FROM) == running[0].number]
    assert len(requeued) == 1 and requeued[0].params == running[0].params and requeued[0].state in FINISHED
    assert requeued[0].user_attrs[schema.PROPOSER] == running[0].user_attrs[schema.PROPOSER]
    assert evaluated_count(records(_study(url))) == 8
    assert not [t for t in after if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_ctrl_c_stops_after_the_current_trial_and_the_run_continues_later(tmp_path):
    url, args, proc = _interrupted(tmp_path, 2, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopping after the current trial" in out and "Traceback" not in err
    trials = _study(url).get_trials()
    assert trials and all(t.state in FINISHED for t in trials)  # the trial under way finished
    assert evaluated_count(records(_study(url))) < 8

    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert "left running" not in done.stdout
    assert evaluated_count(records(_study(url))) == 8


def test_a_trial_killed_between_suggestions_is_queued_again_with_its_whole_enqueued_config(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'search.db'}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    config = {"tile_m": 128, "tile_n": 64, "num_threads": 256}
    study.enqueue_trial(config, user_attrs={schema.PROPOSER: "claude", schema.RATIONALE: "why"})
    proposed = study.ask()
    proposed.suggest_categorical("tile_m", [64, 128])  # the kill comes before tile_n and num_threads
    sampled = study.ask()
    sampled.suggest_categorical("tile_m", [64, 128])
    study.ask()  # killed before its first suggestion: nothing to queue again

    assert close_interrupted(study) == [0, 1, 2]
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 3 + [TrialState.WAITING] * 2
    again = {t.user_attrs[schema.REQUEUED_FROM]: t for t in trials[3:]}
    assert again[0].system_attrs["fixed_params"] == config
    assert (again[0].user_attrs[schema.PROPOSER], again[0].user_attrs[schema.RATIONALE]) == ("claude", "why")
    assert again[1].system_attrs["fixed_params"] == {"tile_m": sampled.params["tile_m"]}
    assert 2 not in again
