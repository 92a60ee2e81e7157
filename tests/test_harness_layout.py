"""The harness's shape: prepare.py is a script (the contract), its engine is the package fa4tune/harness/; the guards
and the seal read one rule: prepare.py and every file under fa4tune/harness/; the pin holds those and every project
module they import (experiment.py and kernels/ aside)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import prepare
from fa4tune.harness import guards, settings, step_server
from fa4tune.harness.isolation import resolve

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_NAMES = [name for name in vars(settings) if name.isupper()]


def tracked_python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (`import a.b`, `from a import b` gives a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_module_imports_the_prepare_script():
    # the tests of prepare.py's own contract (its run, its command line) import it; nothing else does
    importers = [path.relative_to(ROOT).as_posix() for path in tracked_python_files()
                 if path.parts[len(ROOT.parts)] != "tests" and "prepare" in imported_modules(path)]
    assert importers == []


def test_the_step_servers_child_function_is_in_the_harness_package():
    module, _, function = step_server.STEP_FUNCTION.partition(":")
    assert module.startswith("fa4tune.harness.") and resolve(step_server.STEP_FUNCTION).__name__ == function
    assert all(name.startswith("fa4tune.harness.") for name in step_server.PRELOAD)


def test_the_pinned_set_is_prepare_py_the_harness_package_and_what_they_import():
    tracked = subprocess.run(["git", "ls-files", "fa4tune/harness"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = guards.harness_files()
    assert files[:len(tracked) + 1] == ["prepare.py", *sorted(tracked)]
    # then the project modules they import (tests/test_import_graph.py computes them apart), never the agent's
    assert {"fa4tune/config.py", "fa4tune/kernel_class.py", "fa4tune/import_graph.py"} <= set(files)
    # and what every timed call runs through experiment.py: the host path and the emulated occupancy (issue 41)
    assert {"fa4tune/api.py", "fa4tune/sm120_interface.py", "fa4tune/emulated_occupancy.py"} <= set(files)
    assert not [name for name in files if name == "experiment.py" or name.startswith("kernels/")]
    assert list(guards.read_pin()) == files
    assert (guards.HARNESS_MODULE, guards.HARNESS_PACKAGE) == ("prepare", "fa4tune.harness")


def test_prepare_py_names_the_settings_and_each_has_one_source():
    shown = {name for name in vars(prepare) if name.isupper() and hasattr(settings, name)}
    assert {"WARMUP_CALLS", "TIMED_ROUNDS", "INPUT_SETS", "STEP_TIME_LIMIT_S", "GATE_SCALE", "GATE_RANDOM_PROBLEMS"} <= shown
    assert all(getattr(prepare, name) is getattr(settings, name) for name in shown)
    # no other file assigns them a value of its own
    for path in tracked_python_files():
        if path == ROOT / "fa4tune/harness/settings.py":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            assert not names & set(SETTINGS_NAMES) - {"ROOT"}, (path, names & set(SETTINGS_NAMES))


def test_prepare_py_stays_a_contract_a_reader_takes_in_at_once():
    assert len((ROOT / "prepare.py").read_text().splitlines()) <= 400


def test_the_guards_command_runs_without_torch(tmp_path):
    # torch made unimportable: the source check and the pin must not need it
    code = ("import sys\nsys.modules['torch'] = None\nimport runpy\nsys.argv = ['fa4tune.guards']\n"
            "runpy.run_module('fa4tune.guards', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "guards: 0 violation(s) in experiment.py; harness as pinned"


FAKE_EXPERIMENT = '''
from fa4tune import defaults
from tests.prepare_child_targets import torch_attention as attention

forward_config = defaults.upstream_forward
backward_config = defaults.upstream_backward
'''


def test_experiment_py_on_a_gpu_runs_prepare_py_as_a_script(tmp_path, monkeypatch, capsys):
    from fa4tune import cli

    monkeypatch.setitem(sys.modules, "experiment", sys.modules.get("experiment"))
    monkeypatch.delitem(sys.modules, "prepare")
    import torch

    monkeypatch.setattr(cli, "_gpu_available", lambda: True)  # experiment.py hands over to prepare.py ...
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # ... whose run then stops at once, on any machine
    (tmp_path / "experiment.py").write_text(FAKE_EXPERIMENT)
    assert cli.experiment_main(tmp_path / "experiment.py", ["--suite", "quick", "--description", "handed over"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: no_cuda: CUDA is not available: prepare.py times kernels on a GPU (for a static check without one: python experiment.py --static)"]
    assert "prepare" not in sys.modules  # run as prepare.py's command line, not imported
