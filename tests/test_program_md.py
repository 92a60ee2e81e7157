"""program.md's commands exist and run: the files and modules it runs, the metric names it greps, the options it
passes, and the one-liners it gives for the spread and the log."""

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fa4tune import cli, static_report
from fa4tune.harness import metrics
from fa4tune.harness.results_tsv import COLUMNS, ResultRow, append_row
from fa4tune.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = (ROOT / "program.md").read_text()
KERNEL_CLASSES = (ROOT / "docs" / "kernel-classes.md").read_text()  # program.md's guide to a kernel class


def commands() -> list[str]:
    """Every command line of program.md and docs/kernel-classes.md: fenced code blocks, and inline code that starts like a
    command."""
    text = PROGRAM + KERNEL_CLASSES
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    inline = re.findall(r"(?<!`)`((?:uv run|git|grep|tail|timeout) [^`]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    return [line for line in lines + inline if line and not line.startswith("#")]


def segments(command: str) -> list[list[str]]:
    """The simple commands of a line (split at `|`, `&&`, `;`), as words, without redirections or `timeout N`."""
    words = shlex.split(command.replace("$'\\t'", "TAB"))
    out, current, skip = [], [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("|", "&&", ";"):
            out.append(current)
            current = []
        elif word == ">":
            skip = True  # the file name that follows
        elif not re.match(r"\d?>", word):
            current.append(word)
    out.append(current)
    return [s[2:] if s[:1] == ["timeout"] else s for s in out if s]


def python_invocations() -> list[list[str]]:
    """The arguments after `uv run python` in every command."""
    found = []
    for command in commands():
        for words in segments(command):
            if words[:3] == ["uv", "run", "python"]:
                found.append(words[3:])
    return found


def test_program_md_has_the_commands_a_loop_needs():
    text = " ".join(commands())
    for needle in ("git checkout -b autotune/", "uv run python experiment.py", "> run.log 2>&1", "grep \"^fwd_tflops_geomean:",
                   "git reset --keep HEAD~1", "git checkout experiment.py", "uv run python -m fa4tune.guards", "timeout 600"):
        assert needle in text, needle


def test_every_program_it_runs_is_installed():
    for command in commands():
        for words in segments(command):
            assert shutil.which(words[0]), f"{words[0]} (in {command!r}) is not on PATH"


def test_every_python_file_and_module_it_runs_exists():
    seen = set()
    for args in python_invocations():
        if args[0] == "-c":
            continue
        if args[0] == "-m":
            assert importlib.util.find_spec(args[1]) is not None, args[1]
            seen.add(args[1])
        else:
            assert (ROOT / args[0]).is_file(), args[0]
            seen.add(args[0])
    assert {"experiment.py", "fa4tune.guards"} <= seen
    for command in commands():
        for words in segments(command):
            if words[:3] == ["uv", "run", "pytest"]:
                assert all((ROOT / arg).is_file() for arg in words[3:] if not arg.startswith("-")), words


def test_every_experiment_py_option_it_passes_is_accepted():
    for args in python_invocations():
        if args[0] == "experiment.py":
            cli._parser().parse_args(args[1:])  # exits (SystemExit) on an unknown option
        if args[:2] == ["-m", "fa4tune.guards"]:
            assert set(args[2:]) <= {"--pin"}


def test_every_grepped_metric_is_one_the_harness_prints():
    printed = set(metrics.METRIC_NAMES)
    printed |= {line.split(":")[0] for line in static_report.metric_lines([], get_target("sm120"))}
    grepped = set()
    for command in commands():
        for words in segments(command):
            if words[0] == "grep":
                grepped |= set(re.findall(r"\^([A-Za-z_]+):", words[1]))
    assert {"fwd_tflops_geomean", "bwd_tflops_geomean", "configs_ok", "static_configs_ok"} <= grepped
    printed.add("error")  # prepare.py's one-line problem reports, `error: <candidate> <direction> <problem>: <status>: ...`
    assert grepped <= printed, grepped - printed


def test_experiment_py_help_runs():
    done = subprocess.run([sys.executable, "experiment.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--description" in done.stdout and "--static" in done.stdout


def test_the_guards_command_passes_on_this_checkout():
    done = subprocess.run([sys.executable, "-m", "fa4tune.guards"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "guards: 0 violation(s) in experiment.py; harness as pinned"


def _one(needle: str) -> str:
    (command,) = [c for c in commands() if needle in c]
    return command


def test_the_keep_rule_is_fa4tune_keep_on_results_tsv_rows_not_the_table():
    keep = PROGRAM[PROGRAM.index("## Keep or discard"):PROGRAM.index("## Logging")]
    assert "uv run python -m fa4tune.keep 1 2 -2 -1" in keep and "run_2: yes" in keep and "keep: yes" in keep
    assert not [c for c in commands() if "awk" in c]  # no parsing of the rich table's box characters


def _row(description, fwd, bwd, fwd_spread, bwd_spread):
    return ResultRow("2026-11-29T10:00:00+00:00", "abc1234", "manual", "sm120", "NVIDIA H200", "emulated", fwd, bwd, 380.0, 250.0,
                     900.0, "15/15", "ok", "0" * 64, description, {"forward": {}, "fwd_spread_pct": fwd_spread, "bwd_spread_pct": bwd_spread})


def test_the_spread_one_liner_prints_the_last_rows_geomeans_and_spreads(tmp_path):
    for i in range(5):
        append_row(tmp_path / "results.tsv", _row(f"baseline (run {i})", 300.0 + i, 240.0, 0.5 + i, None))
    command = _one("read_rows('results.tsv')").replace("uv run python", shlex.quote(sys.executable))
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    rows = [line.split("  ") for line in done.stdout.splitlines()]
    assert rows == [[f"{300.0 + i}", f"{0.5 + i}", "240.0", "None", f"baseline (run {i})"] for i in range(1, 5)]


def test_the_log_one_liner_shows_the_named_columns(tmp_path):
    command = _one("results.tsv | column")
    fields = [int(f) for f in re.search(r"cut -f ([\d,]+)", command).group(1).split(",")]
    assert [COLUMNS[f - 1] for f in fields] == ["timestamp", "commit", "fwd_tflops_geomean", "bwd_tflops_geomean", "configs_ok", "status", "description"]
    append_row(tmp_path / "results.tsv", ResultRow("2026-11-29T10:00:00+00:00", "abc1234", "manual", "sm120", "NVIDIA H200", "emulated",
                                                   301.5, 240.0, 380.0, 250.0, 900.0, "15/15", "ok", "0" * 64, "baseline (run 1)", {}))
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split() == ["timestamp", "commit", "fwd_tflops_geomean", "bwd_tflops_geomean", "configs_ok", "status", "description"]
    assert row.split()[:6] == ["2026-11-29T10:00:00+00:00", "abc1234", "301.5", "240.0", "15/15", "ok"]


@pytest.mark.parametrize("rule", ["other_attention", "self_timing", "side_stream", "not_ready", "deferred_work", "output_reuse",
                                  "output_type", "harness_access", "harness_edit"])
def test_every_guard_rule_is_explained(rule):
    from fa4tune.harness import guards

    assert rule in guards.WHY
    assert f"| `{rule}` |" in PROGRAM


@pytest.mark.parametrize("path", ["results.tsv", "results.tsv.lock", "run.log", "static.log", "search.db", "search.db-wal",
                                  "search.db.lock", "sm120-tuned.patch", ".cache/static-facts.jsonl"])
def test_what_the_tools_write_at_the_root_is_ignored_by_git(path):
    # program.md: results.tsv stays untracked ("never git add it"); so do the logs, databases and patches the tools write
    done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
    assert done.returncode == 0, f"{path} is not in .gitignore"


def _required_reading() -> tuple[int, list[Path]]:
    """Setup step 2's stated line count and the files it names before "Open the rest"."""
    step = PROGRAM.split("2. Read these files whole", 1)[1].split("Open the rest", 1)[0]
    stated = int(re.search(r"about ([\d,]+) project lines", step).group(1).replace(",", ""))
    return stated, [ROOT / name for name in re.findall(r"`([\w/.]+\.(?:py|md))`", step)]


def test_the_required_reading_is_under_1500_project_lines_and_counted_right():
    stated, files = _required_reading()
    assert {f.name for f in files} >= {"README.md", "program.md", "experiment.py", "prepare.py", "settings.py"}
    for path in files:
        assert path.is_file(), path
    actual = sum(len(path.read_text().splitlines()) for path in files)
    assert actual <= 1500, f"the agent's required reading is {actual} lines: over 1,500"
    assert abs(actual - stated) <= 0.1 * actual, f"program.md says about {stated} lines; the files hold {actual}"
