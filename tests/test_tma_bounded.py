"""The launch-bounded TMA forward (kernels/tma_bounded_forward_sm120.py, kernel="sm120_tma_bounded"): its rules, named
with their numbers; the configs it admits; and (compile-marked) an sm_120a compile where the bound reaches ptxas:
the chunked GQA entry's tile at 214 registers and 2 CTAs/SM unbounded, at most 170 and 3 CTAs/SM with
min_blocks_per_mp=3.

Whether the bound pays on a GPU is bench/gpu_bounded.py's job (docs/measurements/2026-12-03-h200-tma-bounded.md: it
does not, on the H200 with SM120 kernels emulated).
"""

import dataclasses
from pathlib import Path

import pytest

import experiment
from fa4tune.config import ForwardConfig, ProblemClass
from fa4tune.feasibility import check_forward
from fa4tune.kernel_class import forward_kernels
from fa4tune.space import feasible_forward
from fa4tune.static_check import StaticJob, run_static
from fa4tune.targets import get_target
from kernels.tma_bounded_forward_sm120 import MIN_BLOCKS_DOMAIN, TmaBoundedForwardSm120

ROOT = Path(__file__).resolve().parent.parent
TARGET = get_target("sm120")
GQA4_CAUSAL = ProblemClass(128, 128, True, 4)
D64 = ProblemClass(64, 64, False)


def bounded(tile_m=64, tile_n=64, num_threads=128, num_stages=1, Q_in_regs=True, min_blocks_per_mp=3):
    return ForwardConfig(tile_m, tile_n, num_threads, num_stages, Q_in_regs, kernel="sm120_tma_bounded",
                         extra={"min_blocks_per_mp": min_blocks_per_mp})


def test_registered_with_its_bounds_and_the_tma_storage():
    assert forward_kernels(experiment)["sm120_tma_bounded"] is TmaBoundedForwardSm120
    assert MIN_BLOCKS_DOMAIN == (2, 3, 4)
    cfg = bounded()
    # the TMA class's shared storage: Q 16 KB + K 16 KB (with Q in registers V reuses Q's buffer) + 3 mbarriers
    smem, breakdown = TmaBoundedForwardSm120.smem_bytes(cfg, GQA4_CAUSAL)
    assert smem == 32768 + 24 and "24 B of mbarriers" in breakdown
    kernel = TmaBoundedForwardSm120.__new__(TmaBoundedForwardSm120)
    kernel.min_blocks_per_mp = 3
    assert kernel.launch_bounds() == {"min_blocks_per_mp": 3, "preferred_smem_carveout": 100}


def test_bound_beyond_shared_memory_rejected_with_the_numbers():
    # 64x32 tiles, 2 stages at d64: 24,616 B a CTA; 4 CTAs with their reserved KB need 102,560 B of SM120's 102,400
    cfg = bounded(tile_m=64, tile_n=32, num_stages=2, Q_in_regs=False, min_blocks_per_mp=4)
    verdict = check_forward(cfg, D64, TARGET)
    assert not verdict and verdict.rule == "min_blocks_per_mp_fits_smem"
    for number in ("min_blocks_per_mp=4", "24616 B", "+1024 B reserved", "102560 B", "102400 B"):
        assert number in verdict.message, verdict.message
    assert check_forward(dataclasses.replace(cfg, extra={"min_blocks_per_mp": 3}), D64, TARGET)


def test_bound_beyond_threads_or_registers_rejected_with_the_numbers():
    cfg = bounded(tile_m=128, tile_n=32, num_threads=256, min_blocks_per_mp=4)
    assert check_forward(cfg, D64, TARGET)  # 1,024 threads, 64 registers each: SM120 holds them
    few_threads = dataclasses.replace(TARGET, max_threads_per_sm=768)
    verdict = check_forward(cfg, D64, few_threads)
    assert verdict.rule == "min_blocks_per_mp_threads" and "1024 threads" in verdict.message and "768" in verdict.message
    few_registers = dataclasses.replace(TARGET, registers_per_sm=32768)
    verdict = check_forward(cfg, D64, few_registers)
    assert verdict.rule == "min_blocks_per_mp_registers" and "leave 32 registers" in verdict.message
    assert "fewer than 64" in verdict.message


@pytest.mark.parametrize("pc", [D64, ProblemClass(96, 96, True), GQA4_CAUSAL], ids=lambda pc: pc.name)
def test_admits_exactly_the_tma_configs_whose_bound_fits(pc):
    feasible = feasible_forward(pc, TARGET)
    tma = [c for c in feasible if c.kernel == "sm120_tma"]
    admitted = {(c.tile_m, c.tile_n, c.num_threads, c.num_stages, c.Q_in_regs, c.extra_knobs["min_blocks_per_mp"])
                for c in feasible if c.kernel == "sm120_tma_bounded"}
    expected = set()
    for c in tma:
        smem = TmaBoundedForwardSm120.smem_bytes(c, pc)[0]
        for blocks in MIN_BLOCKS_DOMAIN:
            if blocks * (smem + 1024) <= 102400 and blocks * c.num_threads <= 1536:
                expected.add((c.tile_m, c.tile_n, c.num_threads, c.num_stages, c.Q_in_regs, blocks))
    assert admitted == expected
    # a larger bound never admits more
    counts = [sum(key[-1] == b for key in admitted) for b in MIN_BLOCKS_DOMAIN]
    assert counts == sorted(counts, reverse=True) and counts[0] > 0


@pytest.mark.compile
def test_bound_reaches_ptxas_on_sm120a(tmp_path):
    unbounded = ForwardConfig(64, 64, 128, 1, True, kernel="sm120_tma")
    jobs = [StaticJob("fwd", unbounded, GQA4_CAUSAL), StaticJob("fwd", bounded(min_blocks_per_mp=3), GQA4_CAUSAL)]
    free, capped = run_static(jobs, TARGET, ROOT / "experiment.py", workers=2, cache_path=tmp_path / "facts.jsonl")
    assert free.status == "ok" and capped.status == "ok", (free.reason, capped.reason)
    # Recorded 2026-12-03 (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1): 214 registers unbounded, 168 bounded
    assert free.registers > 170 and free.blocks_per_sm == 2 and free.occupancy_limiter == "registers"
    assert capped.registers <= 65536 // (3 * 128) and capped.blocks_per_sm == 3
    assert capped.dynamic_smem_bytes == free.dynamic_smem_bytes == 32768 + 24
    assert capped.spill_store_bytes == free.spill_store_bytes == 0  # the cap costs no spills at this tile
