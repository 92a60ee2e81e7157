"""Every command of the project: `--help` answers before torch is imported, and a bad argument is one `error:`
line on stderr with exit code 2 (fa4tune.cli.CommandParser), as every other refusal."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"experiment.py": ["experiment.py"], "prepare.py": ["prepare.py"], "guards": ["-m", "fa4tune.guards"],
            "search": ["-m", "search"], "search run": ["-m", "search", "run"]}


def run(args, *extra):
    return subprocess.run([sys.executable, *args, *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_answers_before_torch_and_the_cute_dsl_are_imported(name):
    done = run(["-X", "importtime", *COMMANDS[name]], "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ")
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "cutlass", "cuda", "flash_attn", "matplotlib"}, imported & {"torch", "cutlass", "cuda"}


@pytest.mark.parametrize("name,extra,needle", [
    ("experiment.py", ["--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
    ("experiment.py", ["--timeout", "-5"], "argument --timeout: must be more than 0 seconds, got -5"),
    ("experiment.py", ["--jobs", "many"], "argument --jobs: invalid count value: 'many'"),
    ("prepare.py", ["--baseline", "--time-limit", "0"], "argument --time-limit: must be more than 0 seconds, got 0"),
    ("prepare.py", [], "one of the arguments --baseline --experiment --self-check is required"),
    ("guards", ["--bogus"], "unrecognized arguments: --bogus"),
    ("search", ["tune"], "invalid choice: 'tune' (choose from 'run', 'report', 'apply'"),
    ("search", ["bench", "--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
    ("search run", ["--direction", "sideways"], "invalid choice: 'sideways' (choose from 'fwd', 'bwd', 'both')"),
])
def test_a_bad_argument_is_one_error_line_and_exit_2(name, extra, needle):
    done = run(COMMANDS[name], *extra)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()  # no usage block, no traceback
    assert line.startswith("error: ") and needle in line, line
    assert re.search(r"\(usage: (experiment\.py|prepare\.py|python -m \S+( \w+)?) --help\)$", line), line
