"""What the tests of bench/ share. bench/ is a package (bench/__init__.py): a test imports a script plainly
(`from bench import stability`), or by name with load_bench; run_script runs one as a file, as its users do."""

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_bench(name: str):
    """The module bench.<name> (bench/<name>.py), imported as any module is."""
    return importlib.import_module(f"bench.{name}")


def run_script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python bench/<name>.py ARGS` from the repository root, its output captured as text."""
    return subprocess.run([sys.executable, f"bench/{name}.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
