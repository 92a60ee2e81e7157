"""Upstream flash-attention's lint and format rules, applied to the files an export writes.

Upstream's pre-commit (`.pre-commit-config.yaml`) runs ruff v0.11.13 `ruff-check --fix` and `ruff-format` on
`flash_attn/cute/*.py` except flash_bwd, flash_fwd, flash_fwd_sm100 and interface.py, with the rules of
`flash_attn/cute/pyproject.toml` (line length 100; E4, E7, E9, F; E731, E741, F841 ignored). Read from the stored
snapshot of github:Dao-AILab/flash-attention (its newest commit there, 0251105a, #2798, is older than the pinned
b40 release: the b40 rules are assumed unchanged). The added tests under tests/cute/ are formatted the same way,
though upstream's hooks do not run there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fa4tune.config import ConfigError

RUFF_VERSION = "0.11.13"  # upstream's pre-commit: astral-sh/ruff-pre-commit rev v0.11.13
RUFF_CONFIG = """\
line-length = 100

[lint]
select = ["E4", "E7", "E9", "F"]
ignore = ["E731", "E741", "F841", "D102"]
"""
HOOK_FILES = re.compile(r"^flash_attn/cute/.*\.py$")
HOOK_EXCLUDE = re.compile(r"^flash_attn/cute/(flash_bwd|flash_fwd|flash_fwd_sm100|interface)\.py$")
NEW_TESTS = re.compile(r"^tests/cute/.*\.py$")


def linted(path: str) -> bool:
    """Whether upstream's ruff hooks check this file (tests/cute/ too, for the files an export adds there)."""
    return bool(HOOK_FILES.match(path) and not HOOK_EXCLUDE.match(path)) or bool(NEW_TESTS.match(path))


def _ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        raise ConfigError("ruff_missing", f"upstream's lint needs ruff {RUFF_VERSION} (the dev dependency group): run `uv sync`")
    version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout.split()[-1]
    if version != RUFF_VERSION:
        raise ConfigError("ruff_version", f"upstream's lint is ruff {RUFF_VERSION}, {found} is {version}: run `uv sync`")
    return [found]


def _run(args: list[str], path: str, text: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "ruff.toml"
        config.write_text(RUFF_CONFIG)
        return subprocess.run([*_ruff(), *args, "--config", str(config), "--stdin-filename", path, "-"],
                              input=text, capture_output=True, text=True, cwd=tmp)


def format_source(path: str, text: str) -> str:
    """`text` as upstream's hooks leave it: unused imports removed (`ruff check --fix`'s F401), then `ruff format`;
    unchanged for a file the hooks skip. A file ruff cannot parse is one `upstream_lint` error."""
    if not linted(path):
        return text
    fixed = _run(["check", "--fix-only", "--select", "F401", "--quiet"], path, text)
    if fixed.returncode != 0:
        raise ConfigError("upstream_lint", f"{path}: ruff check --fix failed: {fixed.stderr.strip()}")
    done = _run(["format", "--quiet"], path, fixed.stdout or text)
    if done.returncode != 0:
        raise ConfigError("upstream_lint", f"{path}: ruff format failed: {done.stderr.strip()}")
    return done.stdout


def problems(path: str, text: str) -> list[str]:
    """What upstream's hooks would refuse in `text` (ruff check findings, an unformatted file); [] when clean."""
    if not linted(path):
        return []
    found = []
    check = _run(["check", "--output-format", "concise", "--quiet"], path, text)
    found += [line for line in check.stdout.splitlines() if line.strip()]
    form = _run(["format", "--check", "--quiet"], path, text)
    if form.returncode != 0:
        found.append(f"{path}: not formatted as `ruff format` (line length 100) leaves it")
    return found
