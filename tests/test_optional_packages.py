"""Without optuna-dashboard, matplotlib or the anthropic SDK (a GPU machine with only what a search needs): the main
paths run, a run says in one line what it skipped, the dashboard refuses in one line, and the trials are kept."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest

from search import optional
from search.proposing import claude
from search.proposing.proposer import ProposerUnavailable
from search.storing import schema
from search.storing.storage import open_storage
from search_helpers import CLASS, ROOT, SUITE, replay_args, run_cli, write_table

OPTIONAL = "optuna_dashboard,matplotlib,anthropic"
STUDY = f"fwd:{CLASS}:sm120"
NOTES_SKIPPED = "skipped: study notes for optuna-dashboard (optuna_dashboard is not installed)"
CLAUDE_SKIPPED = "skipped: the claude proposer (anthropic is not installed): the sampler takes every turn"


def without(*args, missing: str = OPTIONAL, key: str = "", timeout: int = 180) -> subprocess.CompletedProcess:
    """`python ARGS` in the project root with the `missing` modules unimportable (tests/without_packages.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    if key:
        env["ANTHROPIC_API_KEY"] = key
    return subprocess.run([sys.executable, str(ROOT / "tests" / "without_packages.py"), missing, *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def trials(url: str, name: str = STUDY) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False)


def sampled_only(url: str) -> bool:
    """Every trial of the study finished with its value: upstream's default, then the sampler's or the loop's own
    explore turns (taken when the sampler repeats itself), none of them claude's."""
    kept = trials(url)
    proposers = [t.user_attrs[schema.PROPOSER] for t in kept]
    return (len(kept) > 1 and all(t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
                                    or t.state == optuna.trial.TrialState.PRUNED and t.user_attrs[schema.CONSTRAINT][0] > 0 for t in kept)
            and proposers[0] == "baseline" and "tpe" in proposers and set(proposers[1:]) <= {"tpe", "explore"})


def printed_trials(stdout: str) -> int:
    """How many trial lines a run printed."""
    return sum(1 for line in stdout.splitlines() if line.startswith(f"[{STUDY}] trial "))


def note_attrs(url: str) -> list[str]:
    storage = open_storage(url)
    return [k for k in storage.get_study_system_attrs(storage.get_study_id_from_name(STUDY)) if k.startswith("dashboard:")]


# -- the reason a package is missing -------------------------------------------------------------------


def test_why_missing_names_the_package_that_is_not_installed(monkeypatch):
    assert optional.why_missing("json") is None
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)
    assert optional.why_missing("optuna_dashboard") == "optuna_dashboard is not installed"
    assert optional.why_missing("optuna_dashboard._note") == "optuna_dashboard is not installed"  # the package, not its submodule
    assert optional.skipped("the plots", "matplotlib is not installed") == "skipped: the plots (matplotlib is not installed)"


def test_every_module_of_the_main_paths_imports_without_the_optional_packages():
    names = [f"fa4tune.{p.stem}" for p in sorted((ROOT / "fa4tune").glob("*.py"))]
    names += [f"fa4tune.harness.{p.stem}" for p in sorted((ROOT / "fa4tune" / "harness").glob("*.py"))]
    names += [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in sorted((ROOT / "search").rglob("*.py"))] + ["prepare", "experiment"]
    code = ("import importlib, sys\nfailed = []\n"
            f"for name in {names!r}:\n"
            "    try:\n        importlib.import_module(name)\n"
            "    except Exception as err:\n        failed.append(f'{name}: {err}')\n"
            "print('\\n'.join(failed) or 'all imported')\n")
    done = without("-c", code, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "all imported"


@pytest.mark.parametrize("command,needle", [
    (["experiment.py", "--static", "--suite", "nope"], "error: unknown_suite: suite 'nope'"),
    (["prepare.py", "--baseline", "--suite", "nope"], "error: unknown_suite: suite 'nope'"),
])
def test_experiment_and_prepare_command_lines_answer_without_the_optional_packages(command, needle):
    done = without(*command)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(needle)


# -- search run, report, dashboard, worker ---------------------------------------------------------------


def test_a_finished_run_skips_the_study_notes_in_one_line_and_keeps_its_trials(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    done = without("-m", "search", *replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "3", "--confirmations", "0"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.strip().splitlines()[-1] == NOTES_SKIPPED
    assert f"{STUDY}: 3 evaluated, best" in done.stdout
    assert sampled_only(url) and len(trials(url)) == printed_trials(done.stdout)
    assert note_attrs(url) == []


def test_without_the_sdk_the_sampler_takes_claudes_turns_and_the_run_says_so(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    # a key is set: the run would call the API if it could import the SDK
    done = without("-m", "search", *replay_args(url, write_table(tmp_path), "--n-trials", "4", "--confirmations", "0"), key="test-key")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert CLAUDE_SKIPPED in lines and "proposers none" in lines[lines.index(CLAUDE_SKIPPED) + 1]
    assert f"{STUDY}: 4 evaluated, best" in done.stdout and sampled_only(url) and len(trials(url)) == printed_trials(done.stdout)


def test_the_claude_proposer_without_the_sdk_passes_every_turn(monkeypatch):
    monkeypatch.setattr(claude, "SDK_MISSING", "anthropic is not installed")
    proposer = claude.ClaudeProposer(api_key="test-key")
    assert proposer.client is None
    with pytest.raises(ProposerUnavailable) as err:
        proposer.propose(None)
    assert err.value.permanent and str(err.value) == "the anthropic SDK does not import (anthropic is not installed): the sampler takes claude's turns"
    assert claude.sdk_missing_line() == CLAUDE_SKIPPED


def test_report_plots_are_skipped_in_one_line_after_the_report(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    made = run_cli(*replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "2", "--confirmations", "0"))
    assert made.returncode == 0, made.stderr  # the study, made with every package (in this process: imports paid once)
    figures = tmp_path / "figures"
    done = without("-m", "search", "report", "--storage", url, "--plots", figures)
    assert done.returncode == 0, done.stderr
    assert STUDY in done.stdout
    assert done.stdout.strip().splitlines()[-1] == f"skipped: the plots for {figures} (matplotlib is not installed)"
    assert not figures.exists() or not list(figures.iterdir())


def test_the_dashboard_refuses_in_one_line_and_writes_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    assert run_cli(*replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "2", "--confirmations", "0")).returncode == 0
    before, notes = len(trials(url)), note_attrs(url)
    done = without("-m", "search", "dashboard", "--storage", url, "--port", "0", missing="optuna_dashboard")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: optional_package: the dashboard needs the optuna-dashboard package: optuna_dashboard is not installed"]
    assert len(trials(url)) == before and note_attrs(url) == notes


def test_a_worker_without_the_sdk_says_so_once_and_runs_the_sampler(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    table = write_table(tmp_path)
    made = run_cli("run", "--workers", "0", "--storage", url, "--evaluator", "replay", "--table", table, "--suite", SUITE,
                   "--direction", "fwd", "--problem-class", CLASS, "--results", "", "--n-trials", "3", "--confirmations", "0")
    assert made.returncode == 0, made.stderr
    done = without("-m", "search", "worker", "--storage", url, "--evaluator", "replay", "--table", table, "--results", "",
                   "--worker-id", "w1", key="test-key")
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if "skipped:" in line] == [f"worker w1: {CLAUDE_SKIPPED}"]
    assert f"{STUDY}: 3 evaluated, best" in done.stdout and sampled_only(url)
