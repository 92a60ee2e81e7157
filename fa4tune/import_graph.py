"""The project's import graph, read with `ast` (nothing is imported): every import of every project module, at any
depth (a function's imports included), resolved to the project modules it runs.

The project's modules are prepare.py, experiment.py and every .py under fa4tune/, search/, kernels/ and bench/
(bench/'s scripts import each other by their bare names: `bench.<name>` here). An import names the module and the
packages above it (`from fa4tune.harness import gate` runs fa4tune, fa4tune.harness and fa4tune.harness.gate); a
module's own packages are left out (they are being imported when it runs). Two uses read it:
tests/test_import_graph.py (no cycle, the layers' order) and the harness pin (fa4tune.harness.guards.harness_files:
prepare.py, fa4tune/harness/ and every project module they import, experiment.py and kernels/ aside).

    uv run python -m fa4tune.import_graph          # the cycles, if any (exit 1), and the harness's imports
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("prepare.py", "experiment.py")  # project modules at the root
PACKAGES = ("fa4tune", "search", "kernels")
SCRIPT_DIRS = ("bench",)  # scripts that import each other by bare name


@dataclass(frozen=True)
class Import:
    """One import statement's reach into a project module."""

    source: str  # the importing module
    target: str  # the project module it runs
    line: int
    top: bool  # at the module's top level (runs on import), not inside a function

    def __str__(self) -> str:
        return f"{self.source}:{self.line} -> {self.target}{'' if self.top else ' (in a function)'}"


def project_modules(root: Path | None = None) -> dict[str, Path]:
    """{module name: file} of every project module (bytecode caches aside)."""
    root = root or ROOT
    found = {name.removesuffix(".py"): root / name for name in SCRIPTS if (root / name).is_file()}
    for top in (*PACKAGES, *SCRIPT_DIRS):
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path, root)] = path
    return found


def module_name(path: Path, root: Path | None = None) -> str:
    """'fa4tune/harness/gate.py' -> 'fa4tune.harness.gate'; a package's __init__.py is the package."""
    parts = Path(path).resolve().relative_to((root or ROOT).resolve()).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _function_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a function (they run when it is called, not on import)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return inside


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every project module `module` (the file `path`) imports, at any depth, once per target (its first line)."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    in_function = _function_nodes(tree)
    package = module if _is_package(path) else module.rpartition(".")[0]
    script_dir = module.split(".")[0] if module.split(".")[0] in SCRIPT_DIRS else None
    own = set(_with_parents(package)) if package else set()
    found: dict[str, Import] = {}

    def add(names: list[str], node: ast.AST) -> None:
        for name in names:
            if script_dir and f"{script_dir}.{name}" in known:  # a bench script's bare import of a sibling
                name = f"{script_dir}.{name}"
            for target in _with_parents(name):
                if target in known and target not in own and target != module and target not in found:
                    found[target] = Import(module, target, node.lineno, id(node) not in in_function)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            add([alias.name for alias in node.names], node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            add([stem, *(f"{stem}.{alias.name}" for alias in node.names if alias.name != "*")], node)
    return sorted(found.values(), key=lambda i: (i.line, i.target))


def import_graph(root: Path | None = None) -> dict[str, list[Import]]:
    """{module: the project imports it makes}, for every project module."""
    modules = project_modules(root)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in sorted(modules.items())}


def cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """The import cycles: every strongly connected component of more than one module (Tarjan's, iterative), each
    sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for edge in edges:
                target = edge.target
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph.get(target, ()))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def cycle_path(graph: dict[str, list[Import]], component: list[str]) -> list[Import]:
    """One closed path of imports through a cycle's modules (for a message that names each step)."""
    members = set(component)
    start = component[0]
    # breadth-first from start back to start, inside the component
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph.get(node, ()):
                if edge.target in members and edge.target not in came:
                    came[edge.target] = edge
                    following.append(edge.target)
        if start in came:
            break
        frontier = following
    path, node = [], start
    while True:
        edge = came[node]
        path.append(edge)
        node = edge.source
        if node == start:
            return list(reversed(path))


def imported_by(graph: dict[str, list[Import]], starts: list[str], exclude=lambda name: False) -> set[str]:
    """The modules `starts` import, transitively (the starts included), not following into an excluded module (nor
    listing it)."""
    seen: set[str] = set()
    todo = [name for name in starts if not exclude(name)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [edge.target for edge in graph.get(name, ()) if not exclude(edge.target) and edge.target not in seen]
    return seen


def reachable(starts: list[str], root: Path | None = None, exclude=lambda name: False) -> dict[str, Path]:
    """{module: file} of `starts` and every project module they import, transitively, at any depth, not following
    into an excluded module (nor listing it). Only the modules reached are read (a file that does not parse, an
    edited one, counts with no imports: its hash tells), so an excluded file can never stop the walk."""
    modules = project_modules(root)
    known = set(modules)
    found: dict[str, Path] = {}
    todo = [name for name in starts if name in modules and not exclude(name)]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = modules[name]
        try:
            edges = imports_of(name, modules[name], known)
        except (SyntaxError, ValueError, UnicodeDecodeError):
            edges = []
        todo += [edge.target for edge in edges if not exclude(edge.target) and edge.target not in found]
    return found


def main() -> int:
    graph = import_graph()
    found = cycles(graph)
    for component in found:
        print(f"cycle: {' -> '.join(str(edge) for edge in cycle_path(graph, component))}")
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} project imports, {len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
