"""The optional packages (optuna-dashboard, matplotlib, the anthropic SDK): whether one imports, and the line
that says what a command skipped without it.

A GPU machine often has only what a search needs; there `search run` still finishes (without the study notes
or Claude's turns), and `report --plots` still prints the report. Only `dashboard`, which is nothing but the
package, refuses with one line.
"""

from __future__ import annotations

import importlib


def why_missing(module: str) -> str | None:
    """None when `module` imports; else why not, e.g. 'optuna_dashboard is not installed'."""
    parts = module.split(".")
    for end in range(1, len(parts) + 1):  # the package first: a missing package is "not installed", not its submodule
        name = ".".join(parts[:end])
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:
                return f"{name} is not installed"
            return f"{name} does not import: {err}"
        except ImportError as err:
            return f"{name} does not import: {err}"
    return None


def skipped(what: str, reason: str) -> str:
    """The one line of a skipped step: 'skipped: study notes for optuna-dashboard (optuna_dashboard is not installed)'."""
    return f"skipped: {what} ({reason})"
