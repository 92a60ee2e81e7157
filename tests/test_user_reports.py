"""What a new user tripped on (issue 40, item 7): each report as a test that failed before its fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from fa4tune.suites import load_suite
from search_helpers import SUITE, run_cli, write_table

DECODE = "decode b1 16k d128 gqa4"  # a recorded problem of a class the table never measured (as in h200_sweep.json)


def _table_with_an_unmeasured_decode_problem(tmp_path):
    path = write_table(tmp_path)
    data = json.loads(path.read_text())
    data["measurements"] = [m for m in data["measurements"] if m["kind"] == "fwd" and m["problem_class"] == "d128-causal-bf16"]
    problems = [p for p in load_suite(SUITE) if p.problem_class.name == "d128-causal-bf16"]
    problems += [p for p in load_suite("decode-classes") if p.label == DECODE]
    data["problems"] = [p.to_dict() for p in problems]
    path.write_text(json.dumps(data))
    return path


def test_a_replayed_run_skips_a_class_its_table_cannot_answer_with_one_line_and_leaves_no_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    table = _table_with_an_unmeasured_decode_problem(tmp_path)
    done = run_cli("run", "--storage", url, "--evaluator", "replay", "--table", table, "--direction", "fwd", "--proposer", "none",
                   "--n-trials", "2", "--confirmations", "0", "--results", "", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("skipped ")]
    assert skipped == ["skipped fwd:d128-noncausal-gqa4-decode-bf16:sm120: synthetic_table.json has no fwd measurement of this class"]
    from search.storing.storage import open_storage

    names = optuna.study.get_all_study_names(open_storage(url))
    assert names == ["fwd:d128-causal-bf16:sm120"]
    assert "fwd:d128-causal-bf16:sm120: 2 evaluated" in done.stdout


def test_compile_jobs_minus_one_is_a_one_line_error_naming_the_rule_and_value(tmp_path, capsys):
    from search.__main__ import main

    code = main(["run", "--storage", f"sqlite:///{tmp_path / 'search.db'}", "--evaluator", "replay", "--table", "x.json",
                 "--compile-jobs", "-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: run_config_value:") and "compile_jobs must be >= 0" in err[0] and "got -1" in err[0]
    assert not (tmp_path / "search.db").exists()


def test_a_worker_refuses_compile_jobs_minus_one_too():
    import argparse

    import pytest

    from fa4tune.config import ConfigError
    from search.running.worker import _make_evaluator

    with pytest.raises(ConfigError, match=r"compile_jobs: --compile-jobs must be >= 0 .*got -1"):
        _make_evaluator(argparse.Namespace(slots=0, compile_jobs=-1, evaluator="gpu", table="", replay_delay=0.0), None)


def test_one_study_and_one_trial_left_running_are_said_in_the_singular(tmp_path):
    import io

    from search.running import runner
    from search.running.run_config import RunConfig
    from search_helpers import CLASS, make_loop

    out = io.StringIO()
    config = RunConfig(storage=f"sqlite:///{tmp_path / 'search.db'}", suite=SUITE, directions=["fwd"], problem_classes=[CLASS],
                       n_trials=1, proposer="none", evaluator="replay", table=str(write_table(tmp_path)), confirmations=0,
                       results="")
    assert runner.run(config, out) == 0
    assert "1 study, 1 evaluated config each;" in out.getvalue()

    storage = optuna.storages.InMemoryStorage()
    loop, _, view = make_loop(write_table(tmp_path), storage=storage, n_trials=1, confirmations=0)
    left = loop.study.ask()  # a trial a killed run left RUNNING
    loop.run()
    assert any(f"trial {left.number} was left running, closed as failed and requeued" in m for m in view.messages), view.messages


# `uv run` forwards a SIGINT it gets to its child ~0.2 s later, so that a SIGINT sent to the process group (an agent's
# harness, `timeout -s INT`) reaches the run twice; this stand-in does the same without needing uv on the PATH
FORWARDER = """import signal, subprocess, sys, time
child = subprocess.Popen(sys.argv[1:])
def forward(signum, frame):
    time.sleep(0.2)
    child.send_signal(signal.SIGINT)
signal.signal(signal.SIGINT, forward)
sys.exit(child.wait() % 256)
"""


def test_sigint_to_the_process_group_outside_a_terminal_ends_with_the_summary_and_exit_130(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from optuna.trial import TrialState

    from search.storing.storage import open_storage
    from search_helpers import ROOT, replay_args

    url = f"sqlite:///{tmp_path / 'search.db'}"
    args = replay_args(url, write_table(tmp_path), "--proposer", "none", "--n-trials", "30", "--confirmations", "0",
                       "--replay-delay", "1.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    proc = subprocess.Popen([sys.executable, "-c", FORWARDER, sys.executable, "-m", "search", *map(str, args)], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, deadline = [], time.time() + 240
    while sum(" trial " in line for line in lines) < 3:
        assert time.time() < deadline and proc.poll() is None, "".join(lines) + proc.stderr.read()
        lines.append(proc.stdout.readline())
    os.killpg(proc.pid, signal.SIGINT)  # the whole group: the forwarder and the run
    out, err = proc.communicate(timeout=60)
    out = "".join(lines) + out
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Ctrl-C: stopping after the current trial" in out
    summary = [line for line in out.splitlines() if line.startswith("fwd:d128-causal-bf16:sm120: ")]
    assert len(summary) == 1 and "(stopped by Ctrl-C)" in summary[0], out
    assert out.rstrip().endswith("stopped by Ctrl-C; run the same command again to continue")
    trials = optuna.load_study(study_name="fwd:d128-causal-bf16:sm120", storage=open_storage(url)).get_trials()
    assert trials and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)  # the trials finished so far are kept


def test_report_plots_refuses_to_replace_committed_figures_without_force(tmp_path):
    import argparse
    import subprocess

    import pytest

    from fa4tune.config import ConfigError
    from search.reviewing.cli import FIGURES, check_plots
    from search_helpers import ROOT

    committed = [name for name in FIGURES if (ROOT / "docs" / "img" / name).is_file()]
    assert committed, "docs/img holds the README's figures"
    with pytest.raises(ConfigError, match=r"plots_committed: --plots .*docs/img: best_so_far.png, .* are committed to git.*--force"):
        check_plots(argparse.Namespace(plots=str(ROOT / "docs" / "img"), force=False))
    check_plots(argparse.Namespace(plots=str(ROOT / "docs" / "img"), force=True))  # --force: replaced as asked
    # a folder of one's own, written before, is replaced without asking (its files are not committed)
    own = tmp_path / "figures"
    own.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (own / FIGURES[0]).write_bytes(b"png")
    check_plots(argparse.Namespace(plots=str(own), force=False))
    # the command: one error line and exit 2, before the report prints anything
    done = run_cli("report", "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--plots", "docs/img")
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith("error: plots_committed: --plots docs/img: ") and len(done.stderr.splitlines()) == 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unknown_suite_sampler_or_storage_url_is_refused_before_experiment_py_and_cutlass_are_imported(tmp_path):
    # a user's report (issue 40): a one-line error took 13-16 s, the replay table's space loading experiment.py first
    import subprocess
    import sys

    from search_helpers import ROOT

    probe = ("import sys\nfrom search.__main__ import main\n"
             f"code = main(['run', '--storage', 'sqlite:///{tmp_path / 's.db'}', '--evaluator', 'replay', '--table', "
             "'search/data/h200_sweep.json'] + sys.argv[1:])\n"
             "print(code, 'cutlass' in sys.modules, 'experiment' in sys.modules, 'torch' in sys.modules)\n")
    for option, value, needle in (("--suite", "nosuch", "unknown_suite"), ("--sampler", "nosuch", "sampler"),
                                  ("--storage", "mongodb://localhost/x", "storage_url"),
                                  ("--storage", f"sqlite:///{tmp_path / 'missing' / 's.db'}", "storage_unreachable"),
                                  ("--storage", f"postgresql://tuner@127.0.0.1:{_free_port()}/search", "storage_unreachable")):
        done = subprocess.run([sys.executable, "-c", probe, option, value], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["2", "False", "False", "False"], done.stdout + done.stderr
        assert done.stderr.startswith(f"error: {needle}") and len(done.stderr.splitlines()) == 1, done.stderr


def test_an_unknown_problem_class_is_refused_before_experiment_py_and_cutlass_are_imported(tmp_path):
    # a user's report (issue 40): `search run --problem-class nosuch` took 28 s to say so (the evaluator loaded
    # experiment.py and cutlass before the classes were compared with the suite's)
    import subprocess
    import sys

    from search_helpers import ROOT

    probe = ("import sys\nfrom search.__main__ import main\n"
             f"code = main(['run', '--storage', 'sqlite:///{tmp_path / 's.db'}', '--evaluator', 'replay', '--table', "
             "'search/data/h200_sweep.json', '--problem-class', 'nosuch'])\n"
             "print(code, 'cutlass' in sys.modules, 'experiment' in sys.modules, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False", "False", "False"], done.stdout + done.stderr
    assert done.stderr.startswith("error: problem_class: problem class 'nosuch' has no problems in the suite for fwd, bwd (classes: ")
    assert "d128-causal-bf16" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "s.db").exists()


def test_experiment_py_refuses_an_unknown_suite_or_target_before_importing_itself_and_cutlass():
    # a user's report (issue 40): `python experiment.py --suite nosuch` took 27 s (experiment.py, which imports the
    # CuTe DSL, was imported before the suite was looked up)
    import subprocess
    import sys

    from search_helpers import ROOT

    probe = ("import sys\nfrom fa4tune.cli import experiment_main\n"
             "code = experiment_main('experiment.py', sys.argv[1:])\n"
             "print(code, 'cutlass' in sys.modules, 'experiment' in sys.modules, 'torch' in sys.modules)\n")
    for option, needle in (("--suite", "unknown_suite: suite 'nosuch'"), ("--target", "unknown_target: target 'nosuch'")):
        done = subprocess.run([sys.executable, "-c", probe, option, "nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["2", "False", "False", "False"], done.stdout + done.stderr
        assert done.stderr.startswith(f"error: {needle}") and len(done.stderr.splitlines()) == 1, done.stderr


def test_prepare_py_refuses_an_unknown_suite_or_experiment_file_before_importing_torch():
    # a user's report (issue 40): `prepare.py --experiment experiment.py --suite nosuch` took 26 s (the harness and
    # torch were imported before the suite was looked up)
    import subprocess
    import sys

    from search_helpers import ROOT

    probe = ("import runpy, sys\nsys.argv = ['prepare.py', *sys.argv[1:]]\n"
             "try:\n    runpy.run_path('prepare.py', run_name='__main__')\nexcept SystemExit as done:\n"
             "    print(done.code, 'torch' in sys.modules, 'cutlass' in sys.modules)\n")
    for args, needle in ((["--experiment", "experiment.py", "--suite", "nosuch"], "unknown_suite: suite 'nosuch'"),
                         (["--baseline", "--suite", "nosuch"], "unknown_suite: suite 'nosuch'"),
                         (["--experiment", "nofile.py"], "experiment_file: 'nofile.py' does not exist")):
        done = subprocess.run([sys.executable, "-c", probe, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
        assert done.stderr.startswith(f"error: {needle}") and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.postgres
def test_a_killed_test_process_leaves_no_postgresql_server_running(tmp_path):
    """Ctrl-C on `uv run pytest` (issue 67): the process that started the tests' server can end any way, even
    SIGKILLed before its fixture's teardown, and the server stops and its folder goes."""
    from pg_server import server_bin

    if server_bin() is None:
        pytest.skip("PostgreSQL server binaries not found")
    script = ("import sys, time; sys.path.insert(0, 'tests'); from pg_server import PostgresServer, server_bin\n"
              "server = PostgresServer(server_bin()).start()\n"
              "print(server.postmaster_pid(), server.root, flush=True); time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, root = child.stdout.readline().split()
    assert _alive(int(pid))  # the server runs
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline and (_alive(int(pid)) or Path(root).exists()):
        time.sleep(0.2)
    assert not _alive(int(pid)), "the PostgreSQL server outlived the process that started it"
    assert not Path(root).exists()


def _alive(pid: int) -> bool:
    """The process runs (a zombie waiting for its parent counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
