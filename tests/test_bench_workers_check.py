"""bench/workers_check.py: a failed trial that no other trial finished is lost, a running one is unfinished, and
either fails the exit code."""

import optuna
from optuna.trial import TrialState

from bench import workers_check


def test_lost_and_unfinished_trials_fail_the_check(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url)
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, params={}, distributions={}))
    study.ask()  # left RUNNING
    counts = workers_check.check_study(study)
    assert counts["failed"] == [0] and counts["lost"] == [0] and counts["unfinished"] == [1]
    assert workers_check.main(["--storage", url, "--json", str(tmp_path / "out.json")]) == 1
