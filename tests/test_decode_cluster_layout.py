"""The register layouts of sm120_decode_cluster (kernels/decode_cluster_forward_sm120.py) compute attention: a model of
one warp runs the kernel's own index helpers (which key and columns each thread loads, which words go into each MMA
operand, which lanes the P operand comes from, where the accumulators land) through mma.sync m16n8k16 as the PTX ISA
defines its fragments (A: a0 = (row g, cols 2t, 2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..);
B: b0 = (rows 2t, 2t+1; col g), b1 = (rows 2t + 8, 2t + 9; col g); C: (g, 2t), (g, 2t+1), (g + 8, 2t), (g + 8, 2t+1);
the lower index in a register's low half), with numpy for the tensor cores and the byte permutes. One group of 16 keys
must give S^T = K Q^T and O^T = V^T P^T exactly. The kernel's arithmetic on a GPU is bench/gpu_lpt.py's gate."""

from types import SimpleNamespace

import numpy as np
import pytest

from kernels import decode_cluster_forward_sm120 as dc

LANES = range(32)


def threads():
    return {lane: SimpleNamespace(g=lane // 4, t=lane % 4, lane=lane) for lane in LANES}


def perm(a, b, selector):
    """prmt on words held as (low, high) pairs: the kernel's two selectors only."""
    return {dc.PAIR_LO: (a[0], b[0]), dc.PAIR_HI: (a[1], b[1])}[selector]


def uint4(row, byte_offset):
    """The four words (pairs of elements) of the 16 bytes at byte_offset of a row of 2-byte elements."""
    first = byte_offset // 2
    return [(row[first + 2 * w], row[first + 2 * w + 1]) for w in range(4)]


def mma(acc, a_regs, b_regs):
    """acc[lane] (4 floats) += A B for the warp, from each lane's fragments."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in LANES:
        g, t = lane // 4, lane % 4
        a0, a1, a2, a3 = a_regs[lane]
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a0, a1
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a2, a3
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b_regs[lane]
    C = A @ B
    for lane in LANES:
        g, t = lane // 4, lane % 4
        acc[lane] = [acc[lane][0] + C[g, 2 * t], acc[lane][1] + C[g, 2 * t + 1],
                     acc[lane][2] + C[g + 8, 2 * t], acc[lane][3] + C[g + 8, 2 * t + 1]]


@pytest.mark.parametrize("group", [0, 3])
def test_one_group_gives_s_transposed_and_o_transposed(group):
    rng = np.random.default_rng(group)
    keys = rng.standard_normal((64, dc.HEAD_DIM))  # a warp's 64 keys of K, and of V
    values = rng.standard_normal((64, dc.HEAD_DIM))
    queries = np.zeros((dc.ROWS, dc.HEAD_DIM))
    queries[:4] = rng.standard_normal((4, dc.HEAD_DIM))  # GQA 4: rows 4-7 are the zeros the kernel stores
    c = threads()

    # S^T = K Q^T: K's uint4 i of key _key_k, Q's of row g, the k-steps' operands as _qk_operands picks them
    s_acc = {lane: [0.0] * 4 for lane in LANES}
    for s in range(4):
        for j in range(2):
            a_regs, b_regs = {}, {}
            for lane in LANES:
                th = c[lane]
                ka = uint4(keys[dc._key_k(th, group, 2 * s)], dc._k_col(th, 2 * s))
                kb = uint4(keys[dc._key_k(th, group, 2 * s + 1)], dc._k_col(th, 2 * s + 1))
                qs = uint4(queries[th.g], dc._q_col(th, s))
                a_regs[lane], b_regs[lane] = dc._qk_operands(ka, kb, qs, j)
            mma(s_acc, a_regs, b_regs)
    scores = keys[16 * group:16 * group + 16] @ queries.T  # (16 keys, 8 rows)
    for lane in LANES:
        g, t = lane // 4, lane % 4
        expect = [scores[g, 2 * t], scores[g, 2 * t + 1], scores[g + 8, 2 * t], scores[g + 8, 2 * t + 1]]
        assert np.allclose(s_acc[lane], expect), lane

    # P = S here (no softmax: the layout is what is checked); x, y as the kernel packs them, the shuffles' sources
    x = {lane: (s_acc[lane][0], s_acc[lane][2]) for lane in LANES}
    y = {lane: (s_acc[lane][1], s_acc[lane][3]) for lane in LANES}
    b_regs = {}
    for lane in LANES:
        th = c[lane]
        src1, src2 = dc._p_sources(th)
        pick = y if th.g % 2 else x
        b_regs[lane] = dc._p_operands(pick[src1], pick[src2], perm)
    o_acc = {lane: [[0.0] * 4 for _ in range(8)] for lane in LANES}
    for hh in range(2):
        for wi in range(4):
            mu = 4 * hh + wi
            a_regs = {}
            for lane in LANES:
                th = c[lane]
                words = [uint4(values[dc._key_v(th, group, 2 * slot + hh)], dc._v_col(th, 2 * slot + hh))
                         for slot in range(4)]
                a_regs[lane] = dc._pv_operands(*words, wi, perm)
            acc_mu = {lane: o_acc[lane][mu] for lane in LANES}
            mma(acc_mu, a_regs, b_regs)
            for lane in LANES:
                o_acc[lane][mu] = acc_mu[lane]
    out = scores.T @ values[16 * group:16 * group + 16]  # (8 rows, 128 columns)
    for lane in LANES:
        th = c[lane]
        for mu in range(8):
            col0, col1 = dc._o_cols(th, mu)
            expect = [out[2 * th.t, col0], out[2 * th.t + 1, col0], out[2 * th.t, col1], out[2 * th.t + 1, col1]]
            assert np.allclose(o_acc[lane][mu], expect), (lane, mu)


def test_each_thread_loads_distinct_bytes_and_the_warp_covers_its_group():
    c = threads()
    for group in range(4):
        k_bytes = {(dc._key_k(c[lane], group, i), dc._k_col(c[lane], i)) for lane in LANES for i in range(8)}
        v_bytes = {(dc._key_v(c[lane], group, i), dc._v_col(c[lane], i)) for lane in LANES for i in range(8)}
        whole = {(16 * group + key, 16 * chunk) for key in range(16) for chunk in range(dc.HEAD_DIM // 8)}
        assert k_bytes == whole and v_bytes == whole  # 256 distinct uint4s each: every byte of the group once
