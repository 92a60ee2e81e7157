"""bench/sweep.py: a resumed sweep skips what was measured or started, a torn line is skipped, and --merge writes a
config that a dead process started as a crash."""

import json

from bench import sweep
from fa4tune.config import ForwardConfig

A = ForwardConfig(128, 64, 128, 1, False)
B = ForwardConfig(64, 64, 128, 1, True)


def test_done_keys_and_merge(tmp_path, monkeypatch):
    measured = {"kind": "fwd", "problem_class": "d128-causal-bf16", "config": A.to_dict(), "device": "NVIDIA H200",
                "mode": "emulated", "target": "sm120", "results": []}
    (tmp_path / "sweep-0.jsonl").write_text(json.dumps(measured) + "\n{\"torn")
    (tmp_path / "started-0.jsonl").write_text(json.dumps(["d128-causal-bf16", A.to_dict()]) + "\n"
                                                + json.dumps(["d128-causal-bf16", B.to_dict()]) + "\n")
    assert sweep.done_keys(tmp_path) == {("d128-causal-bf16", A.key()), ("d128-causal-bf16", B.key())}
    monkeypatch.setattr(sweep, "representative_problems", lambda: {})
    sweep.merge(tmp_path, tmp_path / "table.json", "test")
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["device"] == "NVIDIA H200" and len(table["measurements"]) == 2
    assert table["measurements"][1]["results"][0]["status"] == "crash"
