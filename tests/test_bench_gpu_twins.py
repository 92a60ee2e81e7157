"""bench/gpu_twins.py's CPU parts: each problem's twins on every TMA class, deduplicated and feasible, and the
summary's speedups over the TMA twin."""

from types import SimpleNamespace

import pytest

from bench import gpu_twins
from fa4tune import defaults
from fa4tune.config import ForwardConfig
from fa4tune.feasibility import check_forward_problem
from fa4tune.suites import load_suite
from fa4tune.targets import get_target

TARGET = get_target()


def test_twins_keep_the_entry_tile_on_every_tma_class():
    entry = ForwardConfig(64, 96, 128, 2, True, kernel="sm120_splitkv", extra={"num_splits": 0})
    named = gpu_twins.twins(entry)
    assert [label for label, _ in named] == ["table", "tma twin", "lpt twin", "paired twin", "trimmed twin"]
    assert named[0][1] == entry
    for _, cfg in named[1:]:
        assert (cfg.tile_m, cfg.tile_n, cfg.num_threads, cfg.num_stages, cfg.Q_in_regs, cfg.extra_knobs) == (64, 96, 128, 1, True, {})
    assert [cfg.kernel for _, cfg in named[1:]] == ["sm120_tma", "sm120_tma_lpt", "sm120_tma_paired", "sm120_tma_trimmed"]


def test_an_entry_on_the_tma_class_is_its_own_twin_and_upstream_is_always_timed():
    problem = next(p for p in load_suite("chunked") if p.causal)
    entry = ForwardConfig(64, 64, 128, 1, True, kernel="sm120_tma")
    table = SimpleNamespace(forward_config=lambda pc: entry)
    named = gpu_twins.timing_candidates(table, problem, TARGET)
    labels = [label for label, _ in named]
    assert labels[0] == "table" and "tma twin" not in labels and labels[-1] == "upstream"
    assert named[-1][1] == defaults.upstream_forward(problem.problem_class)
    assert len({cfg.key() for _, cfg in named[:-1]}) == len(named) - 1
    assert all(check_forward_problem(cfg, problem, TARGET) for _, cfg in named[:-1])


def test_the_default_configs_pass_the_rules_on_most_of_the_matrix():
    configs = gpu_twins.parse_tma_configs(gpu_twins.DEFAULT_CONFIGS)
    matrix = gpu_twins.matrix_problems() + gpu_twins.prefill_problems()
    for cfg in configs:
        accepted = [p for p in matrix if check_forward_problem(cfg, p, TARGET)]
        assert len(accepted) > len(matrix) // 2, cfg


def test_the_summary_counts_a_twin_only_with_every_run():
    problems = [SimpleNamespace(label="a", causal=True), SimpleNamespace(label="b", causal=False)]
    medians = {("a", "tma twin"): [2.0, 2.0], ("a", "lpt twin"): [1.0, 1.0], ("a", "upstream"): [4.0, 4.0],
               ("b", "table"): [1.0, 1.0], ("b", "trimmed twin"): [0.5]}  # b's entry is its own TMA twin; one run only
    lines, gains = gpu_twins.summarize(problems, medians, runs=2)
    assert gains == {("lpt twin", True): [pytest.approx(2.0)]}
    assert "| a | lpt twin | 1.0000 / 1.0000 | 2.000 | 4.000 |" in lines
    assert not any("trimmed" in line for line in lines)
