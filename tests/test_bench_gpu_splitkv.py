"""bench/gpu_splitkv.py's CPU parts (more in tests/test_splitkv.py): each config also forced to 4 splits, the
timing's candidates, and the kernels compiled ahead for each part."""

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


def test_compile_pairs_follow_the_part():
    configs = gpu_splitkv.parse_configs("32x64x64x2:0")
    matrix = gpu_splitkv.compile_pairs(configs, experiment, SimpleNamespace(part="matrix", only="", suite="decode"))
    assert len(matrix) == 2 * len(gpu_splitkv.matrix_problems())  # as given and forced
    timing = gpu_splitkv.compile_pairs(configs, experiment, SimpleNamespace(part="timing", only="", suite="decode"))
    assert timing and {p.label for _, _, p in timing} <= {p.label for p in load_suite("decode")}
