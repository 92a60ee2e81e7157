"""suites/short.json: short problems (the launch-bound case for the timer) that the sm120 target runs."""

import experiment
from fa4tune.harness import evaluation
from fa4tune.suites import load_suite
from fa4tune.targets import get_target


def test_short_suite_has_short_batched_problems_of_every_kind():
    problems = load_suite("short")
    assert 6 <= len(problems) <= 8
    assert all(p.seqlen_q <= 1024 and p.seqlen_k <= 1024 and p.batch >= 2 for p in problems)
    assert any(p.seqlen_q % 64 for p in problems)  # lengths that are not tile multiples
    assert {p.head_dim for p in problems} == {64, 128} and {p.causal for p in problems} == {True, False}
    assert any((p.num_heads, p.num_heads_kv) == (32, 8) for p in problems)
    assert all(p.backward for p in problems)


def test_every_short_problem_passes_the_sm120_rules_with_the_dispatch_table():
    target = get_target("sm120")
    for problem in load_suite("short"):
        pc = problem.problem_class
        fwd, bwd = experiment.forward_config(pc), experiment.backward_config(pc)
        for direction in ("fwd", "bwd"):
            assert evaluation.feasibility_failure(direction, fwd, bwd, problem, target) == "", (problem.label, direction)
