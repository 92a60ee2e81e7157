"""Imports go one way (docs/architecture.md): no import cycle among the project's modules, a function's imports
included, and the layers the architecture states import no layer above them. The harness pin covers every project
module the harness imports. Pure ast (fa4tune.import_graph): nothing heavy is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4tune import import_graph
from fa4tune.harness import guards

ROOT = Path(__file__).resolve().parent.parent
GRAPH = import_graph.import_graph(ROOT)

# The lowest layers (config, rules) and what they may not import: the stages after them, the agent's files.
LOW = ("fa4tune.config", "fa4tune.verdict", "fa4tune.kernel_class", "fa4tune.feasibility", "fa4tune.space",
       "fa4tune.targets", "fa4tune.defaults", "fa4tune.suites", "fa4tune.command_line", "fa4tune.import_graph")
# (importer prefix, imported prefixes it may not reach): the order the architecture states
LAYERS = [
    ("fa4tune", ("search", "bench", "experiment")),  # fa4tune/ is below search/, and never loads the agent's file by import
    ("fa4tune.harness", ("search", "bench", "experiment", "kernels", "fa4tune.cli", "fa4tune.guards")),  # the harness
    ("kernels", ("fa4tune.harness", "search", "bench", "experiment", "prepare", "fa4tune.cli")),  # our classes
    ("experiment", ("fa4tune.harness", "search", "bench", "prepare")),  # the agent's file (guards.py's rule too)
    ("search", ("bench", "experiment", "prepare")),
    *((low, ("fa4tune.harness", "fa4tune.cli", "fa4tune.guards", "kernels", "search", "experiment")) for low in LOW),
]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_sees_every_project_module_and_its_function_level_imports():
    assert {"prepare", "experiment", "fa4tune.harness.guards", "search.reviewing.export", "kernels"} <= set(GRAPH)
    assert any(name.startswith("bench.") for name in GRAPH)
    assert any(not edge.top for edges in GRAPH.values() for edge in edges)  # imports inside functions are read


def test_there_is_no_import_cycle():
    found = [" -> ".join(str(edge) for edge in import_graph.cycle_path(GRAPH, c)) for c in import_graph.cycles(GRAPH)]
    assert found == [], "import cycles (break each by moving the code where the data flow says it belongs):\n" + "\n".join(found)


@pytest.mark.parametrize("importer, forbidden", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_a_layer_imports_nothing_above_it(importer, forbidden):
    wrong = [str(edge) for name, edges in GRAPH.items() if _under(name, importer)
             for edge in edges if any(_under(edge.target, f) for f in forbidden)]
    assert wrong == []


def test_the_registry_receives_experiment_py_and_never_loads_it():
    # fa4tune.kernel_class is handed the module (sys.modules['experiment'], register_loader); it imports no loader
    targets = {edge.target for edge in GRAPH["fa4tune.kernel_class"]}
    assert not [t for t in targets if _under(t, "fa4tune.harness") or t == "experiment"]
    source = (ROOT / "fa4tune/kernel_class.py").read_text()
    assert "spec_from_file_location" not in source and "load_experiment(" not in source


def test_the_harness_pin_covers_every_project_module_the_harness_imports():
    starts = ["prepare", *guards.DECIDING_MODULES, *(name for name in GRAPH if _under(name, "fa4tune.harness"))]
    # and the measured path: what experiment.py and kernels/ import (fa4tune.api, fa4tune.sm120_interface), not themselves
    agents = [name for name in GRAPH if guards.unpinned_module(name)]
    starts += [edge.target for name in agents for edge in GRAPH[name] if not guards.unpinned_module(edge.target)]
    imported = import_graph.imported_by(GRAPH, starts, exclude=guards.unpinned_module)
    files = {import_graph.project_modules(ROOT)[name].relative_to(ROOT).as_posix() for name in imported}
    pinned = set(guards.harness_files())
    assert sorted(files - pinned) == [], "imported by the harness but not pinned"
    assert sorted(name for name in pinned - files if name.endswith(".py")) == []  # nothing pinned that it does not run
    assert sorted(guards.read_pin()) == sorted(pinned), "re-pin: uv run python -m fa4tune.guards --pin"


def test_the_check_reads_function_level_and_relative_imports(tmp_path):
    (tmp_path / "fa4tune").mkdir()
    (tmp_path / "fa4tune" / "__init__.py").write_text("")
    (tmp_path / "fa4tune" / "a.py").write_text("from fa4tune import b\n")
    (tmp_path / "fa4tune" / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "fa4tune" / "c.py").write_text("import fa4tune.a\n")
    graph = import_graph.import_graph(tmp_path)
    assert import_graph.cycles(graph) == [["fa4tune.a", "fa4tune.b"]]
    path = import_graph.cycle_path(graph, ["fa4tune.a", "fa4tune.b"])
    assert [str(edge) for edge in path] == ["fa4tune.a:1 -> fa4tune.b", "fa4tune.b:2 -> fa4tune.a (in a function)"]
    assert import_graph.imported_by(graph, ["fa4tune.c"]) == {"fa4tune.a", "fa4tune.b", "fa4tune.c"}
    assert set(import_graph.reachable(["fa4tune.c"], tmp_path)) == {"fa4tune.a", "fa4tune.b", "fa4tune.c"}
