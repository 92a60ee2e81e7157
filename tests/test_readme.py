"""README.md is a user's guide: short, its links and commands real, and the main job's lines as a real run prints them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks() -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S)


def test_the_readme_is_a_guide_of_at_most_150_lines():
    assert len(README.splitlines()) <= 150


def test_it_gives_the_two_commands():
    assert "uv run python experiment.py > run.log" in README and "uv run pytest" in README


def test_every_relative_link_and_named_path_exists():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    paths = re.findall(r"`((?:bench|search|fa4tune|kernels|suites|docs|tests)/[\w./-]+)`", README)
    assert links and paths
    for path in [link for link in links if "://" not in link] + paths:
        assert (ROOT / path.rstrip("/")).exists() or path.endswith("/"), path


def test_every_search_subcommand_it_runs_exists():
    from search.__main__ import _parser

    commands = set(re.findall(r"python -m search (\w+)", README))
    assert {"run", "report", "apply", "dashboard", "export"} <= commands
    subparsers = next(a for a in _parser()._actions if a.dest == "command")
    assert commands <= set(subparsers.choices), commands - set(subparsers.choices)


def test_the_results_index_lists_every_record_once():
    index = (ROOT / "docs" / "results.md").read_text()
    records = sorted(p.name for p in (ROOT / "docs" / "measurements").glob("*.md"))
    listed = re.findall(r"\(measurements/([\w.-]+\.md)\)", index)
    assert sorted(listed) == records
    assert listed == sorted(listed, reverse=True), "newest first"


@pytest.mark.compile
def test_the_main_jobs_lines_are_those_a_real_run_prints():
    """The README's command itself, on this CPU machine (the static sm_120a check of the standard suite): its last
    lines are the README's block, value for value."""
    shown = next(block for block in _blocks() if block.startswith("static_configs_ok:")).splitlines()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the static check even on a machine with a GPU
    done = subprocess.run([sys.executable, "experiment.py"], cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-len(shown):] == shown
