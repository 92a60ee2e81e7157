"""bench/gpu_splitkv.py's CPU parts (more in tests/test_splitkv.py): each config also forced to 4 splits, the
timing's candidates and their roles in --out's rows, and the kernels compiled ahead for each part."""

from types import SimpleNamespace

import experiment
from bench import gpu_splitkv
from fa4tune import defaults
from fa4tune.suites import load_suite


def test_the_matrix_runs_each_config_as_given_and_forced_to_four_splits():
    configs = gpu_splitkv.parse_configs("32x64x64x2:0,16x64x32x1:4")
    forced = gpu_splitkv.matrix_configs(configs)
    assert forced[:2] == configs and len(forced) == 3 and forced[2].extra_knobs == {"num_splits": gpu_splitkv.FORCED_SPLITS}


def test_the_timing_compares_with_the_table_and_upstream():
    problem = load_suite("decode")[0]
    configs = gpu_splitkv.parse_configs(gpu_splitkv.DEFAULT_CONFIGS)
    named = gpu_splitkv.timing_configs(configs, experiment, problem)
    assert [cfg for _, cfg in named[:len(configs)]] == configs
    assert named[-2][1] == experiment.forward_config(problem.problem_class) and named[-2][0].startswith("dispatch table: ")
    assert named[-1][1] == defaults.upstream_forward(problem.problem_class)


def test_each_out_row_names_its_role_as_the_exports_decode_table_reads_them():
    from fa4tune.harness.measurement import ProblemResult
    from search.reviewing.pull_request import DECODE_ROLES

    problem = load_suite("decode")[0]
    roles = [role for *_, role in gpu_splitkv._timing_roles(gpu_splitkv.parse_configs("32x64x64x2:0"), experiment, problem)]
    assert roles == [gpu_splitkv.SPLIT_CONFIG, gpu_splitkv.TABLE, gpu_splitkv.UPSTREAM]
    assert set(DECODE_ROLES) == {gpu_splitkv.TABLE, gpu_splitkv.UPSTREAM, gpu_splitkv.SDPA}
    result = ProblemResult(problem.label, "fwd", "ok", tflops=4.2, ms_median=0.016)
    row = gpu_splitkv.table_row(problem, gpu_splitkv.TABLE, "dispatch table: x", result, "NVIDIA H100 80GB HBM3", "mode: emulated")
    assert row == {"problem": problem.label, "problem_class": problem.problem_class.name, "role": "table",
                   "name": "dispatch table: x", "status": "ok", "tflops": 4.2, "ms": 0.016,
                   "device": "NVIDIA H100 80GB HBM3", "mode": "mode: emulated"}


def test_compile_pairs_follow_the_part():
    configs = gpu_splitkv.parse_configs("32x64x64x2:0")
    matrix = gpu_splitkv.compile_pairs(configs, experiment, SimpleNamespace(part="matrix", only="", suite="decode"))
    assert len(matrix) == 2 * len(gpu_splitkv.matrix_problems())  # as given and forced
    timing = gpu_splitkv.compile_pairs(configs, experiment, SimpleNamespace(part="timing", only="", suite="decode"))
    assert timing and {p.label for _, _, p in timing} <= {p.label for p in load_suite("decode")}
