"""bench/harness_cost.py prints each part of a step's seconds for an honest kernel (here on the CPU)."""

from bench import harness_cost
from fa4tune.config import Problem
from fa4tune.harness.settings import Settings
from bench.guards_gpu import einsum_attention
from fa4tune.harness import candidates


def test_a_step_splits_into_gate_timing_and_check():
    problem = Problem(1, 32, 32, 2, 2, 32, 32, True, name="tiny")
    row = harness_cost.step_seconds(candidates.Candidate("einsum", einsum_attention, {}, guarded=True), problem, "fwd", "cpu",
                                    Settings(gate_seed=1, warmup=1, rounds=2, input_sets=2, gate_random_problems=1), repeats=1)
    assert set(row) == {"gate", "timing", "check", "ms"} and 0 < row["check"] < row["timing"] and row["ms"] > 0
