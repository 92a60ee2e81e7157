"""experiment.py's heads-first backward (kernel "sm120_heads_first", issue 44 item 3): its CTA order is a permutation
of upstream's tiles, n block major; it compiles for sm_120a with upstream's shared memory; it stays out of the
search until a GPU run measures it."""

import pytest

import experiment
from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.feasibility import check_backward
from fa4tune.kernel_class import backward_kernels
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.backward_sm120 import BackwardSm120
from search.space import BACKWARD_DOMAIN, backward_space

TARGET = get_target("sm120")
D128_CAUSAL = ProblemClass(128, 128, True)
CONFIG = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=1, num_stages_dO=1, AtomLayoutMSdP=4,
                        AtomLayoutNdKV=2, AtomLayoutMdQ=2)


def test_the_order_is_a_permutation_of_the_tiles_every_head_s_block_before_the_next_block():
    blocks, heads, batch = 5, 3, 2
    tiles = []
    for linear in range(blocks * heads * batch):
        block, rest = experiment.heads_first(linear, heads, batch)
        tiles.append((block, rest % heads, rest // heads))
    assert sorted(tiles) == [(n, h, b) for n in range(blocks) for h in range(heads) for b in range(batch)]
    assert [t[0] for t in tiles] == sorted(t[0] for t in tiles)  # n block 0 (causal: the heaviest) of every head first
    assert tiles[:3] == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]


def test_it_takes_upstream_s_rules_and_shared_memory_and_stays_out_of_the_search():
    twin = BackwardConfig(**{**CONFIG.to_dict(), "kernel": "sm120_heads_first"})
    assert check_backward(twin, D128_CAUSAL, TARGET).ok and check_backward(CONFIG, D128_CAUSAL, TARGET).ok
    assert experiment.HeadsFirstBackwardSm120.smem_bytes(twin, D128_CAUSAL) == BackwardSm120.smem_bytes(CONFIG, D128_CAUSAL)
    assert experiment.kernel_class(twin) is experiment.HeadsFirstBackwardSm120
    assert backward_space(backward_kernels(experiment)).domain == BACKWARD_DOMAIN


@pytest.mark.compile
def test_it_compiles_for_sm120a_like_its_base_with_its_own_order(tmp_path):
    twin = BackwardConfig(**{**CONFIG.to_dict(), "kernel": "sm120_heads_first"})
    base, ours = run_static([StaticJob("bwd", c, D128_CAUSAL) for c in (CONFIG, twin)], TARGET, experiment.__file__,
                            workers=2, cache_path=tmp_path / "facts.jsonl")
    assert base.status == ours.status == "ok", (base.reason, ours.reason)
    assert ours.dynamic_smem_bytes == base.dynamic_smem_bytes == BackwardSm120.smem_bytes(CONFIG, D128_CAUSAL)[0]
    assert ours.registers <= 255 and ours.spill_store_bytes <= base.spill_store_bytes  # the remap costs no spills
