"""Shared pieces of the search tests: a synthetic table, a study loop on it, the CLI (in this process, or its own)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import optuna

from fa4tune.config import ProblemClass
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating.replay import ReplayEvaluator
from search.evaluating.table import load_table
from search.proposing.samplers import make_sampler
from search.proposing.turns import FixedRatio
from search.running.loop import LoopSettings, StopFlag, StudyLoop
from search.storing.study import StudySpec, open_study
from synthetic_table import write_synthetic_table

ROOT = Path(__file__).resolve().parent.parent
SUITE = "quick"
CLASS = "d128-causal-bf16"
TARGET = get_target("sm120")


def write_table(tmp_path, drop: int = 0, kernels: tuple[str, ...] = ()) -> Path:
    """A SYNTHETIC table of the quick suite's classes (forward configs of `kernels` only, when given), the last
    `drop` configs of each (direction, class) left out after that choice (gaps a search meets as 'missing')."""
    path = tmp_path / "synthetic_table.json"
    write_synthetic_table(path, load_suite(SUITE))
    data = json.loads(path.read_text())
    kept = [m for m in data["measurements"] if not kernels or m["kind"] != "fwd" or m["config"]["kernel"] in kernels]
    if drop:
        by_class: dict = {}
        for m in kept:
            by_class.setdefault((m["kind"], m["problem_class"]), []).append(m)
        kept = [m for ms in by_class.values() for m in ms[: len(ms) - drop]]
    data["measurements"] = kept
    path.write_text(json.dumps(data))
    return path


def spec(direction: str = "fwd", name: str = CLASS) -> StudySpec:
    pc = ProblemClass.parse(name)
    return StudySpec(direction, pc, tuple(p for p in load_suite(SUITE) if p.problem_class == pc), TARGET)


class Recorder:
    """A view that keeps every trial record and message."""

    def __init__(self):
        self.trials, self.messages, self.turns = [], [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def turn(self, study, proposer):
        self.turns.append(proposer)

    def trial(self, study, r, best, done, n_trials):
        self.trials.append(r)

    def message(self, text):
        self.messages.append(text)


def make_loop(table_path, sampler="tpe", proposers=(), weights=None, storage=None, evaluator=None, seed=0, **settings):
    """A StudyLoop on the synthetic table (in-memory storage unless one is given); returns (loop, evaluator, view)."""
    storage = storage or optuna.storages.InMemoryStorage()
    s = spec()
    study = open_study(storage, s, make_sampler(sampler, seed, s))
    evaluator = evaluator or ReplayEvaluator(load_table(str(table_path)))
    view = Recorder()
    settings = {"results_path": None, **settings}
    weights = weights or {sampler: 1.0, **{p.name: 1.0 for p in proposers}}
    loop = StudyLoop(study, s, evaluator, sampler, list(proposers), FixedRatio(weights), LoopSettings(**settings), view, StopFlag())
    return loop, evaluator, view


def run_cli(*args, env=None, timeout=120, own_process=False) -> subprocess.CompletedProcess:
    """`python -m search ARGS` in the project root, without an API key unless env gives one: its exit code, stdout and
    stderr. By default in this process (search.__main__.main with the environment, directory and streams swapped in
    for the call), so that a test pays for torch and the CuTe DSL once per process, not once per command;
    `own_process=True` starts the interpreter as a user does, for what only a process shows (imports, signals)."""
    argv = list(map(str, args))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full_env.update(env or {})
    if own_process:
        return subprocess.run([sys.executable, "-m", "search", *argv], cwd=ROOT, env=full_env,
                              capture_output=True, text=True, timeout=timeout)
    from search.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(full_env)
    os.chdir(ROOT)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as done:  # argparse's exits, and sys.exit(...) with a message
                code = done.code if isinstance(done.code, int) or done.code is None else 1
                if not isinstance(done.code, int) and done.code is not None:
                    print(done.code, file=sys.stderr)
            except BaseException:  # what the interpreter would print and exit 1 with
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
    return subprocess.CompletedProcess([sys.executable, "-m", "search", *argv], code or 0, out.getvalue(), err.getvalue())


def replay_args(storage_url: str, table, *extra) -> list:
    """The run arguments of a replayed forward study of CLASS."""
    return ["run", "--storage", storage_url, "--evaluator", "replay", "--table", table, "--suite", SUITE,
            "--direction", "fwd", "--problem-class", CLASS, "--results", "", *extra]
