"""bench/bwd_floor.py: the backward's floor arithmetic (issue 44) against brute force, and its table."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from bench import bwd_floor
from fa4tune.config import Problem
from fa4tune.harness.flops import problem_flops
from fa4tune.suites import load_suite
from search_helpers import ROOT


def _visible_pairs(sq, sk, causal, m, n):
    """Pairs of blocks holding a visible score, by enumerating every score (bottom-right aligned mask)."""
    pairs = set()
    for r, c in itertools.product(range(sq), range(sk)):
        if not causal or c <= r + sk - sq:
            pairs.add((r // m, c // n))
    return len(pairs)


def test_tile_pairs_are_the_blocks_holding_a_visible_score():
    for sq, sk, causal, m, n in [(100, 100, True, 64, 64), (130, 257, True, 64, 128), (257, 130, True, 32, 64),
                                 (37, 37, False, 16, 16), (64, 640, True, 64, 64), (200, 64, True, 64, 32), (1, 90, True, 64, 64)]:
        assert bwd_floor.tile_pairs(sq, sk, causal, m, n) == _visible_pairs(sq, sk, causal, m, n), (sq, sk, causal, m, n)


def test_a_non_causal_floor_counts_every_pair_and_upstream_s_flops():
    p = Problem(2, 1024, 1024, 16, 16, 128, 128, False)
    f = bwd_floor.floor(p, 64, 64)
    assert f.pairs == 2 * 16 * 16 * 16 and f.atomics == f.pairs * 64 * 128  # dQ: a 64x128 fp32 tile added per pair
    assert f.flops == problem_flops(p, "bwd") == 2.5 * 4 * 2 * 16 * 1024 * 1024 * 128
    elements = 2 * 16 * 1024 * 128
    assert f.hbm_bytes == (4 * elements) * 2 + 2 * 2 * 16 * 1024 * 4 + 3 * elements * 2 + 2 * elements * 4 + 2 * elements * 2
    assert f.tensor_ms(644) == f.flops / 644e12 * 1e3


def test_gqa_adds_the_fp32_sums_of_dk_and_dv_and_causal_halves_the_pairs():
    mha, gqa = (bwd_floor.floor(Problem(1, 2048, 2048, 32, hk, 128, 128, True)) for hk in (32, 8))
    assert gqa.pairs == mha.pairs and gqa.atomics == mha.atomics + 32 * 2048 * 256
    assert gqa.hbm_bytes < mha.hbm_bytes + 2 * 32 * 2048 * 256 * 4  # K and V are 4x smaller, the sums cost
    full = bwd_floor.floor(Problem(1, 2048, 2048, 32, 32, 128, 128, False))
    assert mha.pairs == 32 * (32 * 33 // 2) and full.pairs == 32 * 32 * 32


def test_the_table_reads_a_table_run_and_puts_each_time_against_its_floor(capsys):
    log = ROOT / "docs/measurements/logs/2026-12-04-table-lpt-classes.log"
    times = bwd_floor.measured_times(log)
    assert times["b1 s8192 h16 d128"] == ((4.7780 + 4.7708) / 2, (6.4286 + 6.4012) / 2)  # the log's two runs
    assert bwd_floor.main(["--suite", "standard", "--measured", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# backward floors on h200: 644 TFLOPS mma.sync, 4.8 TB/s")
    row = next(line for line in out if line.startswith("| b1 s8192 h16 d128 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    floor_ms = max(float(cells[6]), float(cells[7]))
    table_ms = float(cells[8].split()[0])
    assert abs(float(cells[8].split("(")[1].rstrip("x)")) - table_ms / floor_ms) < 0.01
    backward = [p.name for p in load_suite("standard") if p.backward]
    assert [line.split(" | ")[0].lstrip("| ") for line in out if line.startswith("| ") and "problem" not in line] == backward


def test_a_gemm_s_shared_reads_are_the_distinct_elements_its_warps_fragments_hold():
    """The formula against the CuTe DSL's own tiled MMAs (tests/mma_fragments_probe.py traces them on the CPU)."""
    import json
    import subprocess
    import sys

    cases = [[64, 64, 16, 4, 1], [64, 64, 16, 2, 2], [64, 64, 16, 4, 2], [32, 64, 16, 2, 4], [64, 32, 16, 4, 2]]
    done = subprocess.run([sys.executable, str(ROOT / "tests/mma_fragments_probe.py"), json.dumps(cases)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    traced = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("FRAGMENTS "))[len("FRAGMENTS "):])
    assert traced == [bwd_floor.gemm_shared_reads(*case) for case in cases]


def test_shared_reads_per_pair_for_upstream_s_config_and_the_table_s():
    from fa4tune.config import BackwardConfig, ProblemClass
    from fa4tune.defaults import upstream_backward

    kb = 1024
    # upstream's d128: S and dP 4 x 1 warps (80 KB each), dV, dK, dQ 4 x 1 (72 KB each)
    assert bwd_floor.shared_reads(upstream_backward(ProblemClass(128, 128, True)), 128, 128) == 376 * kb
    eight = BackwardConfig(num_threads=256, AtomLayoutMSdP=4, AtomLayoutNdKV=2, AtomLayoutMdQ=2, dQ_swapAB=True)
    assert bwd_floor.shared_reads(eight, 128, 128) == 384 * kb  # 4 x 2 warps: more warps, as many bytes
    two_by_two = BackwardConfig(AtomLayoutMSdP=2, AtomLayoutNdKV=2, AtomLayoutMdQ=2)
    assert bwd_floor.shared_reads(two_by_two, 64, 64) == 160 * kb  # 2 x 2 warps at d64 (the CMASK4 entries)
    # upstream keeps P and dS in registers for dV and dK only with swapped S/dP, 1 x 4 warps and dKV 4 x 1
    rs = BackwardConfig(SdP_swapAB=True, AtomLayoutMSdP=1, AtomLayoutNdKV=4)
    # dV and dK each skip reading their A operand (P^T, dS^T: 64 x 64, one slice per warp)
    assert bwd_floor.shared_reads(rs, 128, 128) == bwd_floor.shared_reads(replace(rs, SdP_swapAB=False), 128, 128) - 2 * 64 * 64 * 2
    with pytest.raises(ValueError, match="mma_tile"):
        bwd_floor.gemm_shared_reads(64, 32, 16, 1, 4)
    # K in registers for dQ: the dQ gemm's B (K, n x d over AtomLayoutMdQ warps along m) leaves the pair's reads
    eight = BackwardConfig(num_threads=256, AtomLayoutMSdP=4, AtomLayoutNdKV=2, AtomLayoutMdQ=2, kernel="sm120_cmask")
    kregs = replace(eight, kernel="sm120_cmask_kregs")
    assert bwd_floor.shared_reads(eight, 128, 128) - bwd_floor.shared_reads(kregs, 128, 128) == 2 * 64 * 128 * 2 == 32 * 1024


def test_the_shared_table_puts_each_problem_s_config_against_its_floors(capsys):
    log = ROOT / "docs/measurements/logs/2026-12-06-h200-table44-d128-8k.log"
    assert bwd_floor.main(["--shared", "--table", "--measured", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# backward shared-memory floors on h200: 132 SMs x 128 B/clock at 1.98 GHz")
    row = next(line for line in out if line.startswith("| b1 s8192 h16 d128 causal |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # the table's entry keeps K in registers for dQ since 2026-12-06: 32 KB of the 384 a pair read once a CTA instead
    assert cells[1] == "sm120_cmask_kregs 64x64 t256 4/2/2" and cells[2] == "352"
    pairs = 16 * 128 * 129 // 2
    assert float(cells[4]) == pytest.approx(pairs * 352 * 1024 / (132 * 128 * 1.98e9) * 1e3, abs=1e-3)
    assert cells[6].startswith("2.58")  # the log's median table time, 2.5805 and 2.5869 ms
