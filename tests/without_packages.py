"""Runs a module or script as a machine without some packages would: `python tests/without_packages.py
optuna_dashboard,matplotlib,anthropic -m search run ...`, `... NAMES prepare.py --help` or `... NAMES -c CODE`
(from the project root).

A name set to None in sys.modules cannot be imported (ModuleNotFoundError), as if it were not installed.
"""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    names, *rest = sys.argv[1:]
    for name in names.split(","):
        sys.modules[name] = None
    sys.path.insert(0, str(ROOT))
    if rest[0] == "-c":
        sys.argv = ["-c", *rest[2:]]
        exec(compile(rest[1], "<string>", "exec"), {"__name__": "__main__"})
    elif rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")
