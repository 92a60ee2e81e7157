"""bench/bwd_sweep.py: upstream's default first in each class, the classes taken in turn, measured configs skipped;
--merge replaces a table's backward measurements and keeps the rest."""

import json

import pytest

from bench import bwd_sweep
from fa4tune import defaults
from fa4tune.config import BackwardConfig, ProblemClass

CLASSES = ["d128-causal-bf16", "d64-causal-bf16"]


def test_sweep_order():
    order = bwd_sweep.sweep_order(CLASSES, per_class=3, seed=0, done=set())
    assert [pc.name for pc, _ in order] == CLASSES * 3
    assert order[0][1] == defaults.upstream_backward(ProblemClass.parse(CLASSES[0]))
    done = {(CLASSES[0], order[0][1].key())}
    again = bwd_sweep.sweep_order(CLASSES, per_class=3, seed=0, done=done)
    assert len(again) == 5 and order[0] not in again


def test_a_kernel_class_sweeps_its_own_accepted_configs_after_upstream_s_default():
    from fa4tune.harness.candidates import load_default_experiment

    load_default_experiment()  # experiment.py's classes (sm120_cmask) join the registry
    order = bwd_sweep.sweep_order(CLASSES[:1], per_class=0, seed=0, done=set(), kernel="sm120_cmask")
    assert order[0][1] == defaults.upstream_backward(ProblemClass.parse(CLASSES[0]))
    rest = [c for _, c in order[1:]]
    assert rest and all(c.kernel == "sm120_cmask" for c in rest)
    assert any(c.num_threads == 256 for c in rest)  # 8 warps on a causal tile: refused for upstream's class
    opened = bwd_sweep.sweep_order(CLASSES[:1], per_class=0, seed=0, done=set(), kernel="sm120_cmask", opened=True)
    assert opened[0] == order[0] and 0 < len(opened) < len(order)
    assert all(c.AtomLayoutMSdP * 32 != c.num_threads for _, c in opened[1:])  # each puts warps along n


def test_merge_keeps_forward_measurements(tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"measurements": [{"kind": "fwd"}, {"kind": "bwd", "problem_class": "x"}], "problems": []}))
    m = {"kind": "bwd", "problem_class": CLASSES[0], "config": BackwardConfig().to_dict()}
    (tmp_path / bwd_sweep.SWEEP_FILE).write_text(json.dumps(m) + "\n" + json.dumps(m) + "\n")
    bwd_sweep.merge(tmp_path, table)
    out = json.loads(table.read_text())
    assert out["measurements"] == [{"kind": "fwd"}, m] and len(out["problems"]) == 1


def test_opened_without_another_class_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bwd_sweep.py", "--out", str(tmp_path / "out"), "--opened"])
    with pytest.raises(SystemExit) as done:
        bwd_sweep.main()
    assert done.value.code == 2 and "--opened" in capsys.readouterr().err and not (tmp_path / "out").exists()
