"""The TMA forward with its tiles handed out longest first (kernels/tma_lpt_forward_sm120.py, kernel="sm120_tma_lpt"):
searched, the TMA class's storage and rules, a schedule that is a permutation of the grid's tiles with every m block's
tiles before the next shorter one, and (compile-marked) an sm_120a compile of the GQA chunked entry. Its cp.async
sibling in experiment.py (kernel="sm120_lpt", upstream's code at one split): not searched, one split always, and an
sm_120a compile of the d128 causal prefill tile.

Whether it pays on a GPU is bench/gpu_lpt.py's job (docs/measurements/2026-12-04-h200-tma-lpt.md).
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
    # the d96 and d64 causal prefills to sm120_tma_trimmed: tests/test_tma_trimmed.py)
    assert experiment.forward_config(ProblemClass.parse("d128-causal-gqa4-bf16")) == lpt(64, 64)


@pytest.mark.compile
def test_gqa_chunked_entry_compiles_without_spills_at_two_ctas_per_sm(tmp_path):
    (facts,) = run_static([StaticJob("fwd", lpt(), GQA4_CAUSAL_CHUNKED)], TARGET, ROOT / "experiment.py", workers=1,
                          cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    # Recorded 2026-12-04 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): 247 registers (sm120_tma: 240), no spills
    assert facts.spill_store_bytes == facts.spill_load_bytes == 0
    assert facts.dynamic_smem_bytes == 49176 and facts.blocks_per_sm == 2


def test_the_cp_async_sibling_runs_one_split_and_is_not_searched():
    cls = forward_kernels(experiment)["sm120_lpt"]
    assert cls is experiment.LptForwardSm120 and cls.knobs == {} and cls.searched is False
    assert "sm120_lpt" not in get_space("fwd").domain["kernel"]
    cfg = ForwardConfig(64, 64, 128, 1, True, kernel="sm120_lpt")
    d128_causal = ProblemClass(128, 128, True)
    assert cls.num_splits_for(cfg, d128_causal.shortest_problem(), 132) == 1
    assert check_forward(cfg, d128_causal, TARGET)


@pytest.mark.parametrize("grid", [(16, 16, 8), (5, 3, 2), (1, 1, 1), (128, 16, 1)])
@pytest.mark.parametrize("section", [1, 3, 8, 64, 1000])
def test_l2_sections_are_a_permutation_longest_first_within_each(grid, section):
    from kernels.tma_lpt_forward_sm120 import l2_sectioned_longest_first

    m_blocks, heads, batch = grid
    tiles = [l2_sectioned_longest_first(i, m_blocks, heads, batch, section) for i in range(m_blocks * heads * batch)]
    assert sorted(tiles) == sorted(itertools.product(range(m_blocks), range(heads), range(batch)))
    pairs = [h + heads * b for _, h, b in tiles]
    for s in range(0, heads * batch, section):  # one section's tiles together, longest first within it
        idx = [i for i, hb in enumerate(pairs) if s <= hb < s + section]
        assert idx == list(range(idx[0], idx[0] + len(idx)))
        assert [tiles[i][0] for i in idx] == sorted((tiles[i][0] for i in idx), reverse=True)
    if section >= heads * batch:  # one section: longest_first's own order
        assert tiles == [longest_first(i, m_blocks, heads, batch) for i in range(len(tiles))]


def test_l2_section_sizes_follow_the_kv_bytes():
    from kernels.tma_lpt_forward_sm120 import heads_per_l2_section

    key_bytes = (128 + 128) * 2
    assert heads_per_l2_section(1024, key_bytes, 1) == 100  # 512 KB of K and V per head: 100 heads in 50 MB
    assert heads_per_l2_section(8192, key_bytes, 1) == 12
    assert heads_per_l2_section(8192, key_bytes, 4) == 48  # GQA 4: four query heads read each KV head
    assert heads_per_l2_section(1 << 21, key_bytes, 1) == 1  # a head larger than L2: one at a time
    assert heads_per_l2_section(1 << 30, key_bytes, 1) == 1  # no overflow (keys first)


def test_the_l2_sibling_is_not_searched():
    assert "sm120_lpt_l2" not in get_space("fwd").domain["kernel"]
    assert forward_kernels(experiment)["sm120_lpt_l2"].num_splits_for(None, None, 132) == 1


def test_the_in_head_sibling_reverses_m_blocks_within_each_head_and_is_not_searched():
    cls = forward_kernels(experiment)["sm120_lpt_in_head"]
    assert cls is experiment.LptInHeadForwardSm120 and cls.searched is False
    assert "sm120_lpt_in_head" not in get_space("fwd").domain["kernel"]
    assert cls.num_splits_for(None, None, 132) == 1


@pytest.mark.compile
def test_the_cp_async_siblings_compile_like_upstreams_kernel(tmp_path):
    pc = ProblemClass.parse("d128-causal-bf16")
    kernels = ("sm120", "sm120_lpt", "sm120_lpt_l2", "sm120_lpt_in_head")
    facts = run_static([StaticJob("fwd", ForwardConfig(64, 64, 128, 1, True, kernel=k), pc) for k in kernels], TARGET,
                       ROOT / "experiment.py", workers=1, cache_path=tmp_path / "facts.jsonl")
    assert [f.status for f in facts] == ["ok"] * 4, [f.reason for f in facts]
    # Recorded 2026-12-04 (sm_120a): 254 registers, no spills, 32,768 B, 2 CTAs per SM for all four
    assert {(f.spill_store_bytes, f.dynamic_smem_bytes, f.blocks_per_sm) for f in facts} == {(0, 32768, 2)}


def test_the_bench_reads_each_order_flag():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_lpt", ROOT / "bench" / "gpu_lpt.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    configs = bench.parse_configs("64x96x128:q,128x64x128,64x64x128:q:cp,64x96x128:q:p,64x64x128:q:l2,64x64x128:ih")
    assert [c.kernel for c in configs] == ["sm120_tma_lpt", "sm120_tma_lpt", "sm120_lpt", "sm120_tma_paired",
                                           "sm120_lpt_l2", "sm120_lpt_in_head"]
    assert [c.Q_in_regs for c in configs] == [True, False, True, True, True, False]
