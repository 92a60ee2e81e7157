"""search/'s packages follow the data flow: storing and evaluating import no other stage, proposing reads the store,
running drives them all, and reviewing reads the store without the run (it never imports search.running)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from search_helpers import ROOT

STAGES = ("proposing", "evaluating", "storing", "running", "reviewing")
# the stages each stage may import (search/space.py and search/optional.py, the shared vocabulary, are open to all)
ALLOWED = {
    "storing": set(),
    "evaluating": set(),
    "proposing": {"storing"},
    "running": {"storing", "evaluating", "proposing"},
    "reviewing": {"storing", "evaluating", "proposing"},
}


def _modules(stage: str) -> list[str]:
    return [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for p in sorted((ROOT / "search" / stage).glob("*.py"))]


def _imported_stages(path) -> dict[str, int]:
    """{stage: first line} of every search stage a module imports, at its top or inside a function."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "search" and len(parts) > 1 and parts[1] in STAGES:
                found.setdefault(parts[1], node.lineno)
    return found


def test_every_module_of_search_lives_in_a_stage_or_is_shared():
    top = sorted(p.name for p in (ROOT / "search").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "optional.py", "space.py"]
    assert sorted(p.name for p in (ROOT / "search").iterdir() if p.is_dir() and p.name != "__pycache__") == sorted([*STAGES, "data"])


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_only_the_stages_it_builds_on(stage):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports search.{other}"
             for path in sorted((ROOT / "search" / stage).glob("*.py"))
             for other, line in _imported_stages(path).items() if other != stage and other not in ALLOWED[stage]]
    assert wrong == []


def test_reviewing_modules_do_not_import_search_running_even_indirectly():
    code = ("import importlib, sys\n"
            f"for name in {_modules('reviewing')!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('search.running')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    for path in sorted((ROOT / "search" / "reviewing").glob("*.py")):  # nor inside a function
        assert "running" not in _imported_stages(path), path.name


def test_the_import_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from search.storing import schema\n\ndef f():\n    from search.running.view import PlainView\n")
    assert _imported_stages(module) == {"storing": 1, "running": 4}
