"""FLOPs as upstream's bench_utils counts them."""

import pytest

from fa4tune.config import Problem
from fa4tune.harness import flops


def test_non_causal_forward_is_four_b_h_s_s_d():
    # b1 s8192 h16 d128: 4 * b * h * s * s * d (the H200 reference note's formula)
    assert flops.forward_flops(1, 16, 8192, 8192, 128, 128, False) == 4 * 16 * 8192 * 8192 * 128


def test_causal_halves_when_lengths_match():
    full = flops.forward_flops(2, 16, 4096, 4096, 128, 128, False)
    assert flops.forward_flops(2, 16, 4096, 4096, 128, 128, True) == full / 2


def test_causal_with_different_lengths_uses_upstreams_average():
    # bottom-right aligned: rows see sk - sq + 1 .. sk keys, average (max(0, sk - sq) + sk) / 2
    assert flops.average_seqlen_k(1024, 4096, True) == (3072 + 4096) / 2
    assert flops.average_seqlen_k(4096, 1024, True) == 1024 / 2
    assert flops.average_seqlen_k(1, 65536, True) == (65535 + 65536) / 2
    assert flops.forward_flops(1, 32, 1024, 4096, 128, 128, True) == 32 * 2 * 1024 * 3584 * 256


def test_head_dim_v_counts_separately():
    assert flops.forward_flops(1, 1, 10, 10, 192, 128, False) == 2 * 10 * 10 * (192 + 128)


def test_backward_is_two_and_a_half_forward():
    p = Problem(2, 4096, 4096, 16, 16, 96, 96, True)
    assert flops.problem_flops(p, "bwd") == pytest.approx(2.5 * flops.problem_flops(p, "fwd"))


def test_gqa_counts_query_heads():
    p = Problem(1, 2048, 2048, 32, 8, 128, 128, True)
    assert flops.problem_flops(p, "fwd") == flops.forward_flops(1, 32, 2048, 2048, 128, 128, True)


def test_tflops_from_milliseconds():
    assert flops.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert flops.tflops(4 * 16 * 8192**2 * 128, 0.8157) == pytest.approx(674, rel=1e-3)
