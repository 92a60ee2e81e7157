"""Issue 41: every entry point that measures runs the same checks, through one shared entry point.

The shared entry point is fa4tune.harness.candidates.load_experiment: it calls guards.admit (the static rules on
experiment.py and kernels/, and the pin) before any of experiment.py's code runs, in the parent and in each step
child (candidate_from_spec). The run-time trap is set by fa4tune.harness.steps.measure_step for the gate, the timing
and the guards after it (tests/test_planted_cheats.py plants what each catches). Here: the list of entry points that
measure, each shown to go through load_experiment (or through the step children, which do), and nothing in the
project importing experiment.py by name (which would run its code unchecked).
"""

import ast
from pathlib import Path

import pytest

from fa4tune import import_graph
from fa4tune.harness import candidates, guards
from fa4tune.config import BackwardConfig, ForwardConfig

ROOT = Path(__file__).resolve().parents[1]

# Every entry point that measures (times a kernel or gates it for a record), and the file where it loads experiment.py.
MEASURING = {
    "prepare.py": "prepare.py",
    "experiment.py": "fa4tune/cli.py",
    "search run / search worker (one config at a time)": "search/evaluating/gpu.py",
    "search run / search worker (compile-ahead, the default)": "search/evaluating/gpu_pipeline.py",
    "search run / search worker (the space's kernel classes)": "search/space.py",
    "bench/table_vs_upstream.py": "bench/table_vs_upstream.py",
    "bench/peers.py": "bench/peers.py",
    "bench/gpu_splitkv.py": "bench/gpu_splitkv.py",
    "bench/gpu_twins.py": "bench/gpu_twins.py",
    "bench/guards_gpu.py": "bench/guards_gpu.py",
    "bench/harness_cost.py": "bench/harness_cost.py",
    "bench/stability.py": "bench/stability.py",
    "bench/step_server.py": "bench/step_server.py",
    "bench/gpu_smoke.py": "bench/gpu_smoke.py",
    "bench/gpu_call_profile.py": "bench/gpu_call_profile.py",
    "bench/gpu_ncu.py": "bench/gpu_ncu.py",
    "bench/sweep.py": "bench/sweep.py",
    "bench/varlen.py": "bench/varlen.py",
    "bench/fp8_forward.py": "bench/fp8_forward.py",
    "bench/dropin_gpu.py": "bench/dropin_gpu.py",
    "bench/paged_gpu.py": "bench/paged_gpu.py",
    "bench/sinks_gpu.py": "bench/sinks_gpu.py",
}
# Scripts that time only kernels of their own and never run experiment.py's code (nothing of it to check).
OWN_KERNELS_ONLY = {"bench/mma_rate.py": "the GPU's mma.sync rates, NVRTC kernels of its own"}
# Names through which a file reaches the shared entry point: load_experiment itself, or the harness's isolated
# runners, whose step children build each candidate with candidate_from_spec -> load_experiment.
SHARED = {"load_experiment", "load_default_experiment", "evaluate_isolated", "run_steps_isolated", "StepServer",
          "gpu_script_main"}  # bench.common's main of the GPU scripts, which loads through load_default_experiment
# What makes a bench script one that measures: the harness's gate or timer, or a timer of its own.
MEASURES = {"measure_step", "benchmark", "gate_candidate", "_gate_cases", "evaluate_isolated", "run_steps_isolated",
            "StepServer", "do_bench", "CudaEventTimer", "gate_matrix", "time_calls", "Event"}


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found |= {alias.asname or alias.name for alias in node.names} | {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("entry,path", sorted(MEASURING.items()))
def test_each_entry_point_that_measures_goes_through_the_shared_entry_point(entry, path):
    assert (ROOT / path).is_file(), entry
    assert _names(ROOT / path) & SHARED, f"{entry} ({path}) measures without load_experiment (guards.admit: the static rules and the pin)"


def test_the_gpu_scripts_shared_main_loads_through_the_shared_entry_point():
    tree = ast.parse((ROOT / "bench" / "common.py").read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "gpu_script_main")
    called = {n.func.id for n in ast.walk(main) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "load_default_experiment" in called


def test_every_bench_script_that_measures_is_listed():
    # a new script that times must be added above, and so must go through the shared entry point
    listed = {path for path in MEASURING.values()} | set(OWN_KERNELS_ONLY)
    measuring = {f"bench/{p.name}" for p in (ROOT / "bench").glob("*.py") if _names(p) & MEASURES and p.name != "common.py"}
    assert sorted(measuring - listed) == []
    for path in OWN_KERNELS_ONLY:  # and those run nothing of experiment.py's: no loader, no attention, no harness
        names = _names(ROOT / path)
        assert not names & (SHARED | {"experiment", "attention", "candidates", "EXPERIMENT_PATH"}), path


def test_nothing_imports_experiment_py_by_name():
    # `import experiment` runs its top-level code before the static rules: every loader goes through load_experiment
    graph = import_graph.import_graph(ROOT)
    importers = sorted(name for name, edges in graph.items() if any(e.target == "experiment" for e in edges) and not name.startswith("tests"))
    assert importers == []


def test_load_experiment_admits_the_file_before_any_of_its_code_runs(tmp_path, monkeypatch):
    seen = []
    experiment = tmp_path / "experiment.py"
    experiment.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")

    def admit(path, root=None):
        seen.append(Path(path))
        assert not (tmp_path / "ran").exists()
        raise guards.Refused(["guard planted: refused"])

    monkeypatch.setattr(guards, "admit", admit)
    with pytest.raises(guards.Refused):
        candidates.load_experiment(experiment)
    # a step child builds its candidate through the same loader
    spec = candidates.experiment_spec("x", experiment, ForwardConfig(), BackwardConfig())
    with pytest.raises(guards.Refused):
        candidates.candidate_from_spec(spec)
    assert seen == [experiment.resolve()] * 2 and not (tmp_path / "ran").exists()


def test_admit_checks_the_pin_and_the_kernels_sources(tmp_path, monkeypatch):
    experiment = tmp_path / "experiment.py"
    experiment.write_text("x = 1\n")
    monkeypatch.delenv(guards.ALLOW_HARNESS_EDIT, raising=False)
    monkeypatch.setattr(guards, "harness_changes", lambda: [])
    assert guards.admission_refusals(ROOT / "experiment.py") == []  # the shipped experiment.py and the real kernels/
    assert {p.name for p in guards.kernel_sources()} >= {"splitkv_forward_sm120.py", "tuned_forward_sm120.py"}
    monkeypatch.setattr(guards, "harness_changes", lambda: ["fa4tune/harness/steps.py"])
    assert [line.split(":")[0] for line in guards.admission_refusals(experiment)] == ["guard harness_edit"]
    monkeypatch.setenv(guards.ALLOW_HARNESS_EDIT, "1")  # a maintainer's edited harness runs (its rows are marked)
    assert guards.admission_refusals(experiment) == []


def test_search_says_a_refusal_in_one_line_each_not_a_traceback(tmp_path, monkeypatch):
    """`search run` loads experiment.py through load_experiment when its space first asks for the kernel classes: a
    refusal (a static rule, the pin) is an `error:` line per violation and exit code 2, as experiment.py's and
    prepare.py's own command lines say it."""
    import sys

    from search_helpers import replay_args, run_cli, write_table

    table = write_table(tmp_path)
    planted = ["guard harness_edit: prepare.py differs from the hash pinned (planted)", "guard forbidden_import: os (planted)"]
    monkeypatch.setattr(guards, "admission_refusals", lambda path, root=None: planted)
    # the registry asks its loader and the loader admits the file, as in a fresh process
    monkeypatch.delitem(sys.modules, "experiment", raising=False)
    monkeypatch.setattr(candidates, "_EXPERIMENTS", {})
    done = run_cli(*replay_args(f"sqlite:///{tmp_path / 'search.db'}", table, "--proposer", "none", "--n-trials", "2"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {line}" for line in planted]
