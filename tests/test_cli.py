"""experiment.py's command line: bad input gives one line naming the rule, exit code 2, no traceback."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fa4tune import cli, defaults, static_check
from fa4tune.config import ForwardConfig
from fa4tune.static_check import StaticFacts

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
        ({"dtype": "fp32"}, "dtype: dtype must be one of bf16, fp16, fp8, got 'fp32'"),
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


def _edited_copy(tmp_path, *edits):
    """experiment.py with its d64 non-causal entry written as D64 (the shipped entry is whatever the last `search apply`
    wrote), then (old, new) text replacements, next to a one-problem suite; the copy's command line."""
    from search.storing.dispatch_table import edit_dispatch

    source = edit_dispatch((ROOT / "experiment.py").read_text(), "fwd", "d64-noncausal-bf16", ForwardConfig(128, 128, 128, 1))
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    (tmp_path / "experiment.py").write_text(source)
    suite = tmp_path / "one.json"
    suite.write_text(json.dumps({"problems": [{"batch": 1, "seqlen_q": 256, "seqlen_k": 256, "num_heads": 4, "num_heads_kv": 4,
                                               "head_dim": 64, "causal": False, "backward": False}]}))
    return subprocess.run([sys.executable, str(tmp_path / "experiment.py"), "--static", "--no-cache", "--suite", str(suite)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


D64 = '"d64-noncausal-bf16": ForwardConfig(tile_m=128, tile_n=128, num_threads=128, num_stages=1, Q_in_regs=False)'
D96 = '"d96-causal-bf16": replace(TRIMMED'


def test_dispatch_entries_that_cannot_run_are_refused_one_line_each_before_any_compile(tmp_path):
    proc = _edited_copy(tmp_path, (D64, D64.replace("tile_n=128, num_threads=128", "tile_n=120, num_threads=100")),
                        (D96, D96.replace("causal", "casual")))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: FORWARD_DISPATCH['d96-casual-bf16']: problem_class_name: cannot parse problem class 'd96-casual-bf16' "
        "(expected e.g. d128-causal-gqa4-bf16)",
        "error: FORWARD_DISPATCH['d64-noncausal-bf16']: infeasible on sm120: tile_n_multiple_of_16: tile_n must be a multiple of 16, got 120",
    ]
    assert "static check:" not in proc.stdout  # nothing compiled


def test_an_unknown_knob_in_a_dispatch_entry_is_one_line_naming_the_knobs_and_the_line(tmp_path):
    proc = _edited_copy(tmp_path, (D64, D64.replace("tile_n=128,", "tile_n=128, tile_k=32,")))
    line = next(i + 1 for i, text in enumerate((tmp_path / "experiment.py").read_text().splitlines()) if "tile_k=32" in text)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "error: unknown_knob: ForwardConfig has no knob 'tile_k' (knobs: tile_m, tile_n, num_threads, num_stages, Q_in_regs, kernel; "
        "a kernel class's own knobs go in extra={...}) "
        f"(experiment.py:{line})"]


def test_a_kernel_that_fails_to_compile_is_an_error_line_and_exit_1(monkeypatch, capsys):
    # a config the static rules allow but the compiler rejects: a result of the run (exit 1), named on stderr
    def compile_error(jobs, target, **kw):
        return [StaticFacts(status="compile_error", reason="AssertionError: num_threads must be divisible by tQK_shape_dim_1",
                            kind=j.kind, problem_class=j.problem_class.name, config=j.config.to_dict(), num_threads=j.config.num_threads)
                for j in jobs]

    monkeypatch.setattr(static_check, "run_static", compile_error)
    module = types.SimpleNamespace(__file__=str(ROOT / "experiment.py"), forward_config=defaults.upstream_forward,
                                   backward_config=defaults.upstream_backward)
    assert cli.static_main(module, cli._parser().parse_args(["--static", "--suite", "quick"])) == 1
    out, err = capsys.readouterr()
    assert "static_configs_ok: 0/" in out
    errors = err.splitlines()
    assert errors and all(e.startswith("error: static ") and ": compile_error: AssertionError: num_threads must be divisible" in e
                          and e.endswith("[target=sm120 mode=static]") for e in errors)
    assert "error: static fwd d128-causal-bf16: compile_error: " in err
