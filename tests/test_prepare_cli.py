"""prepare.py on bad input, and evaluate() end to end on CPU tensors (a torch "kernel", wall-clock timer)."""

import json
import subprocess
import sys
import types

import pytest
import torch

import prepare
from fa4tune import defaults
from fa4tune.config import BackwardConfig, ForwardConfig, Problem
from fa4tune.harness import evaluation, runs
from fa4tune.harness.settings import ROOT, Settings
from prepare_child_targets import torch_attention

torch.set_num_threads(1)  # tiny CPU matmuls crawl on two contended threads

SMALL = Settings(gate_seed=11, warmup=1, rounds=2, input_sets=2, gate_random_problems=1)


def one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_unknown_suite_is_one_line_naming_it(capsys):
    assert prepare.main(["--baseline", "--suite", "nope"]) == 2
    line = one_error_line(capsys)
    shipped = ", ".join(sorted(path.stem for path in (ROOT / "suites").glob("*.json")))
    assert line.startswith("error: unknown_suite:") and "'nope'" in line and f"is not one of {shipped}" in line


def test_malformed_suite_file_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"problems": [ {"batch": 1, ')
    assert prepare.main(["--baseline", "--suite", str(bad)]) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: suite_file: malformed suite file") and "bad.json" in line


def test_a_suite_problem_with_a_bad_field_is_named(tmp_path, capsys):
    bad = tmp_path / "odd.json"
    bad.write_text(json.dumps({"problems": [{"name": "odd heads", "batch": 1, "seqlen_q": 64, "seqlen_k": 64,
                                             "num_heads": 6, "num_heads_kv": 4, "head_dim": 64, "causal": False}]}))
    assert prepare.main(["--baseline", "--suite", str(bad)]) == 2
    line = one_error_line(capsys)
    assert "odd heads" in line and "gqa_ratio" in line


def test_an_empty_problem_filter_is_one_line(capsys):
    assert prepare.main(["--baseline", "--suite", "quick", "--only", "nothing like this"]) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: problem_filter:") and "(problems: " in line and "b1 s8192 h16 d128 causal" in line


def test_missing_experiment_file_is_one_line(tmp_path, capsys):
    assert prepare.main(["--experiment", str(tmp_path / "nope.py")]) == 2
    assert one_error_line(capsys).startswith("error: experiment_file:")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_baseline_without_cuda_exits_2_with_one_line_from_the_command_line():
    done = subprocess.run([sys.executable, str(ROOT / "prepare.py"), "--baseline"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no_cuda: CUDA is not available")


def fake_experiment(attention=torch_attention):
    """An experiment module whose attention is a CPU torch implementation, with upstream's dispatch."""
    return types.SimpleNamespace(
        attention=attention, forward_config=defaults.upstream_forward, backward_config=defaults.upstream_backward,
    )


D64 = Problem(1, 96, 96, 2, 2, 64, 64, True, name="tiny d64 causal")
D256 = Problem(1, 96, 96, 2, 2, 256, 256, False, name="tiny d256")
DECODE = Problem(1, 1, 80, 4, 2, 64, 64, False, backward=False, name="tiny decode")


def test_an_infeasible_problem_is_named_and_the_others_still_run():
    m = evaluation.evaluate("fwd", ForwardConfig(tile_m=128, tile_n=64), [D256, D64, DECODE], fake_experiment(),
                         device="cpu", settings=SMALL)
    by_problem = {r.problem: r for r in m.results}
    infeasible = by_problem["tiny d256"]
    assert infeasible.status == "infeasible"
    assert infeasible.reason.startswith("forward config: smem_capacity: needs 131072 B")
    assert infeasible.ms_median is None
    line = runs.problem_error_line("target=sm120 device=cpu mode=cpu", "fwd", infeasible)
    assert line.startswith("fwd tiny d256: infeasible: forward config: smem_capacity") and "\n" not in line
    for name in ("tiny d64 causal", "tiny decode"):
        ok = by_problem[name]
        assert ok.status == "ok", ok.reason
        assert ok.tflops > 0 and ok.ms_min <= ok.ms_median <= ok.ms_max
        assert ok.max_errors["out"] <= ok.max_errors["out_tolerance"]
        assert ok.max_errors["gate_seed"] == 11 and ok.max_errors["gate_cases"] == 4
    assert m.kind == "fwd" and m.config == ForwardConfig(tile_m=128, tile_n=64).to_dict()
    assert not m.ok and m.status == "infeasible"


def test_backward_evaluation_skips_decode_and_checks_gradients():
    m = evaluation.evaluate("bwd", defaults.upstream_backward(D64.problem_class).to_dict(), [D64, DECODE],
                         fake_experiment(), device="cpu", settings=SMALL)
    assert [r.problem for r in m.results] == ["tiny d64 causal"]
    assert m.ok and m.problem_class == "d64-causal-bf16"
    assert set(m.results[0].max_errors) >= {"dq", "dk", "dv", "dq_tolerance"}


def test_a_wrong_kernel_is_incorrect_and_never_timed():
    def wrong(q, k, v, causal=False, fwd_config=None, bwd_config=None, return_lse=False):
        out, lse = torch_attention(q, k, v, causal, return_lse=True)
        out = out.clone()
        out[..., -1] = 0  # the last output column is never written
        return (out, lse) if return_lse else out

    m = evaluation.evaluate("fwd", ForwardConfig(tile_m=128, tile_n=128), [D64], fake_experiment(wrong), device="cpu", settings=SMALL)
    (r,) = m.results
    assert r.status == "incorrect" and r.tflops is None and r.ms_median is None
    assert r.reason.startswith("normal (b1 s96 h2 d64 causal): out max error")  # the gate case's shape
    assert r.max_errors["out"] > r.max_errors["out_tolerance"]


def test_the_configs_reach_the_kernel():
    seen = set()

    def recording(q, k, v, causal=False, fwd_config=None, bwd_config=None, return_lse=False):
        seen.add((fwd_config, bwd_config))
        return torch_attention(q, k, v, causal, return_lse=return_lse)

    cfg = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, num_stages=2)
    evaluation.evaluate("fwd", cfg, [D64], fake_experiment(recording), device="cpu", settings=SMALL)
    assert seen == {(cfg, defaults.upstream_backward(D64.problem_class))}


def test_infeasible_backward_config_is_named():
    too_big = BackwardConfig(m_block_size=128, n_block_size=256, num_stages_Q=2, num_stages_dO=2)
    m = evaluation.evaluate("bwd", too_big, [D64], fake_experiment(), device="cpu", settings=SMALL)
    assert m.results[0].status == "infeasible"
    assert m.results[0].reason.startswith("backward config: smem_capacity")
