"""Bad input to `python -m search run`: a one-line error on stderr, exit code 2, the storage untouched."""

from __future__ import annotations

import os
import socket

import optuna
import pytest

from search.storing import schema
from search.storing.storage import open_storage
from search_helpers import replay_args, run_cli, spec, write_table

STUDY = "fwd:d128-causal-bf16:sm120"


def _one_line_error(done, *needles):
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in done.stderr


def test_an_unknown_storage_url_scheme(tmp_path):
    _one_line_error(run_cli(*replay_args("mongodb://localhost/x", write_table(tmp_path))), "storage_url", "'mongodb'")
    assert not list(tmp_path.glob("*.db"))


def test_a_sqlite_file_in_a_directory_that_does_not_exist(tmp_path):
    url = f"sqlite:///{tmp_path / 'missing' / 'search.db'}"
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path))), "storage_unreachable", "does not exist")
    assert not (tmp_path / "missing").exists()


def test_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("not a database\n")
    _one_line_error(run_cli(*replay_args(f"sqlite:///{path}", write_table(tmp_path))), "storage_unreachable", "not a SQLite database")
    assert path.read_text() == "not a database\n"


def test_an_unreachable_postgresql_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _one_line_error(run_cli(*replay_args(f"postgresql://tuner@127.0.0.1:{port}/search", write_table(tmp_path))), "storage_unreachable")


def test_a_study_that_exists_with_another_space_is_refused_untouched(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    old = {**spec().user_attrs(), schema.SPACE_SIGNATURE: "0123456789abcdef"}  # e.g. made with an older domain
    for key, value in old.items():
        study.set_user_attr(key, value)
    study.enqueue_trial({"tile_m": 128})
    before = (optuna.load_study(study_name=STUDY, storage=storage).user_attrs, len(study.get_trials()))
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path))), "study_space", STUDY, "0123456789abcdef")
    after = optuna.load_study(study_name=STUDY, storage=open_storage(url))
    assert (after.user_attrs, len(after.get_trials())) == before


def test_a_study_of_other_problems_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    study = optuna.create_study(study_name=STUDY, storage=open_storage(url), direction="maximize")
    for key, value in {**spec().user_attrs(), schema.PROBLEMS: ["b1 s1024 h8 d128 causal"]}.items():
        study.set_user_attr(key, value)
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path))), "study_problems", "b1 s1024 h8 d128 causal")


def test_a_config_file_with_wrong_types_leaves_no_storage(tmp_path):
    config = tmp_path / "search.toml"
    config.write_text('n-trials = "ten"\nsampler = "tpe"\n')
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path)), "--config", config), "run_config_type", "n_trials must be an integer", "'ten'")
    assert not (tmp_path / "search.db").exists()


def test_a_config_file_with_an_unknown_setting(tmp_path):
    config = tmp_path / "search.json"
    config.write_text('{"n_trials": 5, "samplr": "tpe"}')
    _one_line_error(run_cli(*replay_args(f"sqlite:///{tmp_path / 'search.db'}", write_table(tmp_path)), "--config", config), "unknown setting 'samplr'")
    assert not (tmp_path / "search.db").exists()


def test_a_config_file_sets_what_the_command_line_leaves(tmp_path):
    config = tmp_path / "search.toml"
    config.write_text('n-trials = 3\nconfirmations = 0\nproposer = "none"\nsampler = "random"\n')
    url = f"sqlite:///{tmp_path / 'search.db'}"
    done = run_cli(*replay_args(url, write_table(tmp_path)), "--config", config)
    assert done.returncode == 0, done.stderr
    trials = optuna.load_study(study_name=STUDY, storage=open_storage(url)).trials
    assert sum(t.user_attrs[schema.EVALUATED] for t in trials) == 3
    proposers = {t.user_attrs[schema.PROPOSER] for t in trials}  # the file's sampler; explore: the loop's own turn
    assert "random" in proposers and proposers <= {"baseline", "random", "explore"}


def test_a_missing_table_and_an_unknown_sampler(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _one_line_error(run_cli(*replay_args(url, tmp_path / "nope.json")), "table_file", "does not exist")
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path), "--sampler", "cmaes")), "sampler must be one of")
    assert not (tmp_path / "search.db").exists()


def test_an_unknown_problem_class_lists_the_classes(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path), "--problem-class", "d999")),
                    "problem_class: problem class 'd999'", "(classes: d128-causal-bf16, ")
    _one_line_error(run_cli("bench", "--table", write_table(tmp_path), "--problem-class", "d999", "--seeds", "1"),
                    "problem_class: table", "no forward problem class 'd999' (classes: ", "d128-causal-bf16")
    assert not (tmp_path / "search.db").exists()


@pytest.mark.parametrize("option,value,needle", [
    ("--window", "0", "window must be at least 1, got 0"), ("--replay-delay", "-1", "replay_delay must be >= 0, got -1.0"),
    ("--api-timeout", "0", "api_timeout must be > 0 seconds, got 0.0"), ("--compile-jobs", "-3", "compile_jobs must be >= 0"),
])
def test_numbers_out_of_range_are_refused(tmp_path, option, value, needle):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _one_line_error(run_cli(*replay_args(url, write_table(tmp_path), option, value)), "run_config_value", needle)
    assert not (tmp_path / "search.db").exists()


def test_apply_on_a_storage_without_studies_of_the_target(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    optuna.create_study(study_name="someone else's", storage=open_storage(url))
    _one_line_error(run_cli("apply", "--storage", url, "--experiment", tmp_path / "nope.py"), "experiment_file")
    (tmp_path / "experiment.py").write_text("FORWARD_DISPATCH = {}\n")
    _one_line_error(run_cli("apply", "--storage", url, "--experiment", tmp_path / "experiment.py"), "storage_empty", "no search studies for target sm120")


def test_report_and_apply_on_a_storage_that_does_not_exist(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _one_line_error(run_cli("report", "--storage", url), "storage_empty")
    _one_line_error(run_cli("apply", "--storage", url), "storage_empty")
    assert not (tmp_path / "search.db").exists()


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="a GPU is present")
def test_the_gpu_evaluator_without_a_gpu(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _one_line_error(run_cli("run", "--storage", url, "--evaluator", "gpu", "--suite", "quick", "--proposer", "none"), "gpu_evaluator", "no CUDA GPU")
    assert not (tmp_path / "search.db").exists()
