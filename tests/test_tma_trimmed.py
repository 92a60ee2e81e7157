"""The paired TMA forward with the masked blocks' PV gemms trimmed (kernels/tma_trimmed_forward_sm120.py,
kernel="sm120_tma_trimmed"): registered and searched, the four chunked entries and the d96 and d64 causal prefill
entries run it, the visible-key count never drops a key that some row of the warp may see (checked against
upstream's mask rule, brute force) and keeps no 16-key step that none of them sees, and (compile-marked) sm_120a
compiles of the GQA chunked and d96 chunked entries without spills at their CTAs per SM.

Whether it pays on a GPU is bench/gpu_twins.py's job (the trimmed twin of each entry); the GPU gate ran
the correctness matrix (docs/measurements/2026-12-04-h200-trimmed-pv.md).
"""

import itertools
import math
from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.kernel_class import forward_kernels
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_forward_sm120 import TmaForwardSm120, visible_keys
from kernels.tma_paired_forward_sm120 import TmaPairedForwardSm120
from kernels.tma_trimmed_forward_sm120 import TmaTrimmedForwardSm120
from search.space import get_space

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
ENTRIES = {  # the classes whose entries run it, and their tiles (tile_m, tile_n, Q_in_regs)
    "d128-causal-chunked-bf16": (64, 96, True),
    "d128-causal-gqa4-chunked-bf16": (64, 96, True),
    "d96-causal-chunked-bf16": (128, 64, False),
    "d64-causal-chunked-bf16": (128, 64, True),
    "d96-causal-bf16": (64, 96, False),
    "d64-causal-bf16": (128, 64, True),
}
STEP = 16  # keys per k step of the PV gemm (the MMA's K)

pytestmark = pytest.mark.usefixtures("this_experiment")  # tests/conftest.py


def trimmed(tile_m=64, tile_n=96, Q_in_regs=True):
    return ForwardConfig(tile_m, tile_n, 128, 1, Q_in_regs, kernel="sm120_tma_trimmed")


def test_registered_searched_and_the_chunked_and_two_causal_prefill_entries_run_it():
    assert forward_kernels(experiment)["sm120_tma_trimmed"] is TmaTrimmedForwardSm120
    assert issubclass(TmaTrimmedForwardSm120, TmaPairedForwardSm120)  # the paired schedule, trimmed
    assert TmaTrimmedForwardSm120.trim_masked and not TmaForwardSm120.trim_masked and not TmaPairedForwardSm120.trim_masked
    assert "sm120_tma_trimmed" in get_space("fwd").domain["kernel"]
    for name, tile in ENTRIES.items():
        assert experiment.forward_config(ProblemClass.parse(name)) == trimmed(*tile), name


def seen_by(row, n_block, tile_m, tile_n, m_block, qhead, seqlen_q, seqlen_k, causal):
    """Upstream's mask, one packed row: the key columns of block n_block (offsets in the block) the row keeps."""
    query = (m_block * tile_m + row) // qhead
    limit = min(seqlen_k, query + 1 + seqlen_k - seqlen_q) if causal else seqlen_k
    return {c for c in range(tile_n) if n_block * tile_n + c < limit}


@pytest.mark.parametrize("tile_m,tile_n,warps", [(64, 96, 4), (128, 64, 4), (64, 64, 4), (128, 128, 8)])
@pytest.mark.parametrize("qhead,seqlen_q,seqlen_k,causal", [
    (1, 512, 8192, True), (4, 512, 8192, True), (8, 64, 1000, True), (4, 1000, 1000, True), (1, 1, 4095, True),
    (1, 300, 777, False), (4, 17, 34, True),
])
def test_the_trimmed_steps_hold_every_visible_key_and_no_step_without_one(tile_m, tile_n, warps, qhead, seqlen_q, seqlen_k, causal):
    rows_per_warp_block = 16 * warps  # upstream's MMA layout: warps stacked along M in 16-row groups
    m_blocks = math.ceil(seqlen_q * qhead / tile_m)
    steps_total = tile_n // STEP
    for m_block, warp in itertools.product(range(m_blocks), range(warps)):
        rows = [r for r in range(tile_m) if (r % rows_per_warp_block) // 16 == warp]
        for n_block in range(math.ceil(seqlen_k / tile_n)):
            seen = set().union(*(seen_by(r, n_block, tile_m, tile_n, m_block, qhead, seqlen_q, seqlen_k, causal) for r in rows))
            n_valid = visible_keys(n_block, m_block, max(rows), tile_m, tile_n, qhead, seqlen_q, seqlen_k, causal)
            kept = sum(k * STEP < n_valid for k in range(steps_total))  # the kernel's count of PV steps
            assert all(c // STEP < kept for c in seen), (m_block, warp, n_block, n_valid)
            assert kept == (max(seen) // STEP + 1 if seen else 0), (m_block, warp, n_block, n_valid)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["d128-causal-gqa4-chunked-bf16", "d96-causal-chunked-bf16"])
def test_chunked_entries_compile_without_spills(name, tmp_path):
    problem_class = ProblemClass.parse(name)
    (facts,) = run_static([StaticJob("fwd", trimmed(*ENTRIES[name]), problem_class)], TARGET, ROOT / "experiment.py",
                          workers=1, cache_path=tmp_path / "facts.jsonl")
    assert facts.status == "ok", facts.reason
    # Recorded 2026-12-04 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): the GQA entry 255 registers (the paired
    # twin 246), the d96 one 255; no spills; the GQA entry's two CTAs per SM kept
    assert facts.spill_store_bytes == facts.spill_load_bytes == 0
    if name == "d128-causal-gqa4-chunked-bf16":
        assert facts.dynamic_smem_bytes == 49176 and facts.blocks_per_sm == 2
