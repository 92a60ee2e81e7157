import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def this_experiment(request, monkeypatch):
    """The registry reads the module loaded as `experiment`; a test before may leave another there (an agent's copy,
    tests/test_kernel_protocol.py): put back the one the requesting test module imported (this tree's experiment.py)."""
    experiment = request.module.experiment
    monkeypatch.setitem(sys.modules, "experiment", experiment)
    return experiment


# The slowest files first (seconds on the 2-core CI machine, docs/measurements/2026-12-05-test-suite-time.md). Each
# file runs whole on one worker (--dist loadfile), in collection order: a long file collected last would keep one
# core busy while the other idles; longest first leaves the short files to even out the end.
SLOW_FIRST = ("test_search_workers.py", "test_search_export.py", "test_static_check.py", "test_search_gpu_evaluator.py",
              "test_readme.py", "test_optional_packages.py", "test_tma_kernel.py", "test_compile_stage.py", "test_splitkv.py",
              "test_tma_trimmed.py", "test_search_dashboard.py", "test_search_bench.py", "test_step_server.py", "test_user_reports.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: a file's own order is kept
