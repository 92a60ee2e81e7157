"""experiment.py's command line: bad input gives one line naming the rule, exit code 2, no traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_experiment(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "experiment.py"), "--static", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--suite", "nope"], "unknown_suite: suite 'nope'"),
        (["--target", "sm999"], "unknown_target: target 'sm999'"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    proc = run_experiment(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]) == 1


@pytest.mark.parametrize(
    "problem,needle",
    [
        ({"head_dim": 100}, "head_dim_multiple_of_8: head_dim must be a positive multiple of 8, got 100"),
        ({"dtype": "fp32"}, "dtype: dtype must be one of bf16, fp16, got 'fp32'"),
        ({"num_heads_kv": 5}, "gqa_ratio"),
        ({"tile_m": 128}, "unknown_knob: Problem has no knob 'tile_m'"),
    ],
)
def test_bad_suite_file_is_one_line_exit_2(tmp_path, problem, needle):
    entry = {"name": "bad", "batch": 1, "seqlen_q": 128, "seqlen_k": 128, "num_heads": 16, "num_heads_kv": 16, "head_dim": 64, "causal": False}
    entry.update(problem)
    suite = tmp_path / "bad.json"
    suite.write_text(json.dumps({"problems": [entry]}))
    proc = run_experiment("--suite", str(suite))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_malformed_suite_file(tmp_path):
    suite = tmp_path / "broken.json"
    suite.write_text("{not json")
    proc = run_experiment("--suite", str(suite))
    assert proc.returncode == 2 and "suite_file: malformed suite file" in proc.stderr


def test_unknown_knob_value_in_dispatch_table_is_named(tmp_path):
    # a dispatch entry that breaks a rule shows up in the static report as infeasible, with the rule
    source = (ROOT / "experiment.py").read_text().replace(
        '"d64-noncausal-bf16": ForwardConfig(tile_m=128, tile_n=128, num_threads=128, num_stages=1, Q_in_regs=False)',
        '"d64-noncausal-bf16": ForwardConfig(tile_m=128, tile_n=120, num_threads=128, num_stages=1, Q_in_regs=False)',
    )
    (tmp_path / "experiment.py").write_text(source)
    suite = tmp_path / "one.json"
    suite.write_text(json.dumps({"problems": [{"batch": 1, "seqlen_q": 256, "seqlen_k": 256, "num_heads": 4, "num_heads_kv": 4,
                                               "head_dim": 64, "causal": False, "backward": False}]}))
    proc = subprocess.run([sys.executable, str(tmp_path / "experiment.py"), "--static", "--no-cache", "--suite", str(suite)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert "tile_n_multiple_of_16: tile_n must be a multiple of 16, got 120" in proc.stdout.replace("\n", " ").replace("  ", " ") or "tile_n_multiple_of_16" in proc.stdout
    assert "static_configs_ok: 0/1" in proc.stdout
