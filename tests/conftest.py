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
