"""The TMA forward with warp pairs (kernels/tma_pairs_forward_sm120.py, kernel="sm120_tma_pairs"): registered but not
searched, its shared-memory formula (the TMA class's plus P and the row stats), its rules named with their numbers,
and (compile-marked) an sm_120a compile of the chunked GQA tile: no spills, the declared bytes, 2 CTAs per SM.

Whether it is correct and fast on a GPU is bench/gpu_pairs.py's job (docs/measurements/2026-12-04-h200-tma-pairs.md:
the gate passes, and it is 5-15 % slower than the table on the chunked suite, H200 with SM120 kernels emulated).
"""

from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.space import forward_domain
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_pairs_forward_sm120 import TmaPairsForwardSm120

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4_CAUSAL = ProblemClass(128, 128, True, 4)


def pairs(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=True):
    return ForwardConfig(tile_m, tile_n, num_threads, num_stages, Q_in_regs, kernel="sm120_tma_pairs")


def test_registered_not_searched_with_p_and_row_stats_in_its_storage():
    assert forward_kernels(experiment)["sm120_tma_pairs"] is TmaPairsForwardSm120
    assert TmaPairsForwardSm120.searched is False
    assert "sm120_tma_pairs" in forward_domain()["kernel"]  # the registry's domain; the search's leaves it out
    smem, breakdown = TmaPairsForwardSm120.smem_bytes(pairs(), GQA4_CAUSAL)
    # max(Q, V) 16 KB (V reuses Q's buffer) + K 16 KB + 3 mbarriers, then P 64 x 64 x 2 B and 64 rows x 2 warps x 4 B
    assert smem == 16384 + 16384 + 24 + 8192 + 512 == 41496
    assert "P 8192" in breakdown and "row stats 512 B" in breakdown
    assert check_forward(pairs(), GQA4_CAUSAL, TARGET)


def test_tile_n_and_head_dims_must_split_in_halves_of_32_columns():
    verdict = check_forward(pairs(tile_n=96), GQA4_CAUSAL, TARGET)
    assert not verdict and verdict.rule == "pairs_tile_n_multiple"
    assert "tile_n=96 is not a multiple of 64" in verdict.message
    verdict = check_forward(pairs(), ProblemClass(96, 96, True), TARGET)
    assert not verdict and verdict.rule == "pairs_head_dim_multiple"
    assert "head_dim=96 is not a multiple of 64" in verdict.message
    assert check_forward(pairs(), ProblemClass(64, 64, False), TARGET)


def test_threads_are_the_pair_grid_ones():
    verdict = check_forward(pairs(num_threads=64), GQA4_CAUSAL, TARGET)
    assert not verdict and verdict.rule == "num_threads_domain"


@pytest.mark.compile
def test_chunked_gqa_tile_compiles_without_spills_at_two_ctas_per_sm(tmp_path):
    (facts,) = run_static([StaticJob("fwd", pairs(), GQA4_CAUSAL)], TARGET, ROOT / "experiment.py", workers=1,
                          cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    # Recorded 2026-12-04 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): 248 registers, no spills
    assert facts.spill_store_bytes == facts.spill_load_bytes == 0
    assert facts.dynamic_smem_bytes == 41496
    assert facts.blocks_per_sm == 2
