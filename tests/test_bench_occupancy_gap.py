"""bench/occupancy_gap.py: CTAs per SM of a kernel on the target and on the emulating GPU, from its facts (no
compile here: the facts are given)."""

import dataclasses
from types import SimpleNamespace

from bench_helpers import load_bench
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.targets import get_target


def test_a_kernel_the_h200_holds_three_times_runs_alone_on_sm120():
    bench = load_bench("occupancy_gap")
    target = get_target("sm120")
    h200 = dataclasses.replace(target, **bench.DEVICES["h200"])
    pc = ProblemClass(128, 128, True, 1)
    job = SimpleNamespace(config=ForwardConfig(tile_m=64, tile_n=64, num_threads=128, kernel="sm120_tma"), problem_class=pc)
    # the d128 causal table entry's sm_120a facts: 168 registers, 50 KB dynamic + 1 KB static shared memory
    facts = SimpleNamespace(registers=168, dynamic_smem_bytes=50176, static_smem_bytes=1024)
    (row,) = bench.rows([job], [facts], target, h200)
    assert row["smem"] == 51200
    assert row["target"] == (1, "smem")  # 100 KB per SM: one CTA of 51 KB (+1 KB reserved) at a time
    assert row["device"] == (3, "registers")  # 228 KB: four by shared memory, three by registers



def test_a_config_without_facts_is_a_row_that_says_so():
    bench = load_bench("occupancy_gap")
    target = get_target("sm120")
    job = SimpleNamespace(config=ForwardConfig(), problem_class=ProblemClass(128, 128, False, 1))
    (row,) = bench.rows([job], [SimpleNamespace(registers=None, status="compile_error")], target, target)
    assert row["target"] == row["device"] == (0, "compile_error")
