"""The TMA forward with its tiles handed out longest first (kernels/tma_lpt_forward_sm120.py, kernel="sm120_tma_lpt"):
searched, the TMA class's storage and rules, a schedule that is a permutation of the grid's tiles with every m block's
tiles before the next shorter one, and (compile-marked) an sm_120a compile of the GQA chunked entry.

What it pays on a GPU: docs/measurements/2026-12-04-h200-tma-lpt.md.
"""

import itertools
from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_forward_sm120 import TmaForwardSm120
from kernels.tma_lpt_forward_sm120 import TmaLptForwardSm120, longest_first
from search.space import get_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4_CAUSAL_CHUNKED = ProblemClass.parse("d128-causal-gqa4-chunked-bf16")


pytestmark = pytest.mark.usefixtures("this_experiment")  # tests/conftest.py


def lpt(tile_m=64, tile_n=96, num_threads=128, num_stages=1, Q_in_regs=True):
    return ForwardConfig(tile_m, tile_n, num_threads, num_stages, Q_in_regs, kernel="sm120_tma_lpt")


def test_registered_and_searched_with_the_tma_storage_and_rules():
    assert forward_kernels(experiment)["sm120_tma_lpt"] is TmaLptForwardSm120
    assert "sm120_tma_lpt" in get_space("fwd").domain["kernel"]
    tma = ForwardConfig(64, 96, 128, 1, True, kernel="sm120_tma")
    assert TmaLptForwardSm120.smem_bytes(lpt(), GQA4_CAUSAL_CHUNKED) == TmaForwardSm120.smem_bytes(tma, GQA4_CAUSAL_CHUNKED)
    assert TmaLptForwardSm120.smem_bytes(lpt(), GQA4_CAUSAL_CHUNKED)[0] == 24576 + 24576 + 24  # max(Q, V) + K + barriers
    for cfg in (lpt(), lpt(tile_m=128, tile_n=64, Q_in_regs=False), lpt(num_stages=2)):
        ours, theirs = check_forward(cfg, GQA4_CAUSAL_CHUNKED, TARGET), check_forward(
            ForwardConfig(cfg.tile_m, cfg.tile_n, cfg.num_threads, cfg.num_stages, cfg.Q_in_regs, kernel="sm120_tma"),
            GQA4_CAUSAL_CHUNKED, TARGET)
        assert bool(ours) == bool(theirs) and ours.rule == theirs.rule, (cfg, ours, theirs)


@pytest.mark.parametrize("grid", [(32, 8, 1), (5, 3, 2), (1, 1, 1), (7, 1, 4)])
def test_the_schedule_is_a_permutation_longest_tiles_first(grid):
    m_blocks, heads, batch = grid
    tiles = [longest_first(x + m_blocks * (y + heads * z), m_blocks, heads, batch)
             for z, y, x in itertools.product(range(batch), range(heads), range(m_blocks))]  # launch order: x fastest
    assert sorted(tiles) == sorted(itertools.product(range(m_blocks), range(heads), range(batch)))
    m_in_launch_order = [m for m, _, _ in tiles]
    assert m_in_launch_order == sorted(m_in_launch_order, reverse=True)  # the last (longest causal) m block first
    assert tiles[0] == (m_blocks - 1, 0, 0) and tiles[-1] == (0, heads - 1, batch - 1)


def test_the_causal_entries_that_run_it():
    # docs/measurements/2026-12-04-h200-lpt-classes.md (the chunked classes went on to sm120_tma_paired, and they and
    # the d96 and d64 causal prefills to sm120_tma_trimmed: tests/test_tma_trimmed.py; the d128 causal GQA 2 / 4 / 8
    # classes too since the opaque thread index in bf16, 2026-12-06-h100-models-opaque-fp8-wide.md): the d256 GQA 2
    assert experiment.forward_config(ProblemClass.parse("d256-causal-gqa2-bf16")) == ForwardConfig(
        tile_m=128, tile_n=32, num_threads=256, num_stages=1, Q_in_regs=False, kernel="sm120_tma_lpt")


@pytest.mark.compile
def test_gqa_chunked_entry_compiles_without_spills_at_two_ctas_per_sm(tmp_path):
    (facts,) = run_static([StaticJob("fwd", lpt(), GQA4_CAUSAL_CHUNKED)], TARGET, ROOT / "experiment.py", workers=1,
                          cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    # Recorded 2026-12-04 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): 247 registers (sm120_tma: 240), no spills
    assert facts.spill_store_bytes == facts.spill_load_bytes == 0
    assert facts.dynamic_smem_bytes == 49176 and facts.blocks_per_sm == 2
