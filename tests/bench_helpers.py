"""Loads a bench/ script as a module, for the tests of its pure parts (bench/ is not a package: its scripts run as
files). The module is registered under its name, since dataclasses look their module up."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_bench(name: str):
    """bench/<name>.py, executed as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
