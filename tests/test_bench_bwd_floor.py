"""bench/bwd_floor.py: the backward's floor arithmetic (issue 44) against brute force, and its table."""

from __future__ import annotations

import itertools

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
