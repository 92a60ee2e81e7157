"""The longest-first TMA forward with each SM's second CTA the shortest tile left (kernels/tma_paired_forward_sm120.py,
kernel="sm120_tma_paired"): registered and searched (its trimmed subclass runs the chunked entries), a schedule that is a permutation of the grid's tiles for any
SM count, pairs (CTA L, CTA L + S) that sum to about the same work at the issue's chunked prefill, and (compile-marked)
an sm_120a compile of the GQA chunked entry's tile with the %nsmid read in it.

Whether it pays on a GPU is bench/gpu_twins.py's job (the paired twin of each entry).
"""

import itertools
import math
from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_lpt_forward_sm120 import longest_first
from kernels.tma_paired_forward_sm120 import TmaPairedForwardSm120, paired_longest_first
from search.space import get_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4_CAUSAL_CHUNKED = ProblemClass.parse("d128-causal-gqa4-chunked-bf16")


pytestmark = pytest.mark.usefixtures("this_experiment")  # tests/conftest.py


def paired(tile_m=64, tile_n=96, Q_in_regs=True):
    return ForwardConfig(tile_m, tile_n, 128, 1, Q_in_regs, kernel="sm120_tma_paired")


def schedule(m_blocks, heads, batch, sms):
    return [paired_longest_first(x + m_blocks * (y + heads * z), m_blocks, heads, batch, sms)
            for z, y, x in itertools.product(range(batch), range(heads), range(m_blocks))]  # launch order: x fastest


def test_registered_searched_with_the_tma_rules():
    # the GQA 4 and d96 chunked entries ran it until its trimmed subclass took them (tests/test_tma_trimmed.py)
    assert forward_kernels(experiment)["sm120_tma_paired"] is TmaPairedForwardSm120
    assert "sm120_tma_paired" in get_space("fwd").domain["kernel"]
    ours = check_forward(paired(), GQA4_CAUSAL_CHUNKED, TARGET)
    lpt = check_forward(ForwardConfig(64, 96, 128, 1, True, kernel="sm120_tma_lpt"), GQA4_CAUSAL_CHUNKED, TARGET)
    assert bool(ours) and bool(lpt)


@pytest.mark.parametrize("grid", [(8, 32, 1), (5, 3, 2), (1, 1, 1), (7, 1, 4), (16, 16, 8)])
@pytest.mark.parametrize("sms", [1, 7, 132, 170, 10_000])
def test_the_schedule_is_a_permutation_for_any_sm_count(grid, sms):
    tiles = schedule(*grid, sms)
    assert sorted(tiles) == sorted(itertools.product(*(range(n) for n in grid)))


def test_first_round_is_longest_first_and_one_round_grids_are_unchanged():
    tiles = schedule(8, 32, 1, 132)
    lpt = [longest_first(i, 8, 32, 1) for i in range(256)]
    assert tiles[:132] == lpt[:132]
    assert schedule(4, 8, 1, 132) == [longest_first(i, 4, 8, 1) for i in range(32)]  # 32 CTAs: one round


def key_blocks(m_block, tile_m=64, tile_n=96, seqlen_q=512, seqlen_k=8192):
    """Key blocks of a causal (bottom-right aligned) m block: the work of its CTA."""
    return math.ceil((seqlen_k - seqlen_q + (m_block + 1) * tile_m) / tile_n)


def test_pairs_at_the_chunked_prefill_are_balanced():
    """sq 512 over sk 8K, 32 heads, 64x96 tiles: 256 CTAs, two per SM on 132 SMs. CTA L and L + 132 share an SM."""
    sms = 132
    for order, heaviest in ((lambda i: longest_first(i, 8, 32, 1), 86 + 83), (lambda i: schedule(8, 32, 1, sms)[i], 86 + 81)):
        load = [key_blocks(order(p)[0]) + (key_blocks(order(p + sms)[0]) if p + sms < 256 else 0) for p in range(sms)]
        assert max(load) == heaviest


@pytest.mark.compile
def test_gqa_chunked_tile_compiles_without_spills_at_two_ctas_per_sm(tmp_path):
    (facts,) = run_static([StaticJob("fwd", paired(), GQA4_CAUSAL_CHUNKED)], TARGET, ROOT / "experiment.py", workers=1,
                          cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    assert facts.spill_store_bytes == facts.spill_load_bytes == 0
    assert facts.dynamic_smem_bytes == 49176 and facts.blocks_per_sm == 2
