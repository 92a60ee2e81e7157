"""A problem's sliding window and soft-cap through the harness (issue 69): the gate runs the candidate and the fp32
reference with them (a forward that ignores either fails), the timed checks' row reference applies them, FLOPs count
the keys a window leaves, the memory floor reads only the keys some row sees, and SDPA takes a window but not a
soft-cap (one error). CPU only: the candidates here are written in torch."""

from __future__ import annotations

import pytest
import torch

from fa4tune.config import ConfigError, Problem
from fa4tune.harness import flops, gate, memory_floor, runtime_guards
from fa4tune.harness.candidates import sdpa_candidate

MISTRAL = Problem(1, 8192, 8192, 32, 8, 128, 128, True, window_size_left=4096, window_size_right=0)
GEMMA2 = Problem(1, 96, 96, 4, 2, 64, 64, True, window_size_left=40, window_size_right=0, softcap=50.0)


def test_call_arguments_are_the_problem_s_window_and_softcap_only_where_set():
    assert gate.call_arguments(GEMMA2) == {"window_size": (40, 0), "softcap": 50.0}
    assert gate.call_arguments(Problem(1, 96, 96, 4, 2, 64, 64, True)) == {}
    assert gate.call_arguments(Problem(1, 96, 96, 4, 2, 64, 64, True, window_size_right=0)) == {}  # plain causal


def _reference_forward(seen: list):
    def forward(q, k, v, causal, **arguments):
        seen.append(arguments)
        ref = gate.reference_attention(q, k, v, causal, dtype=q.dtype, **arguments)
        return ref.out.to(q.dtype), ref.lse
    return forward


def _inputs(problem, seed=0):
    return gate.random_inputs(problem, seed, "cpu", count=4)


def test_the_gate_runs_the_forward_and_the_reference_with_the_window_and_softcap():
    seen = []
    q, k, v, dout = _inputs(GEMMA2)
    result = gate.gate_forward(_reference_forward(seen), q, k, v, True, **gate.call_arguments(GEMMA2))
    assert result.passed and seen == [{"window_size": (40, 0), "softcap": 50.0}]
    result = gate.gate_backward(_differentiable, q, k, v, True, dout, **gate.call_arguments(GEMMA2))
    assert result.passed, result.reason


def _differentiable(q, k, v, causal, window_size, softcap):
    """Attention written out in fp32 with the window and the soft-cap, for autograd (q, k, v: b, s, h, d)."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.float().repeat_interleave(group, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) / q.shape[-1] ** 0.5
    scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(q.shape[1])
    scores = scores.masked_fill(gate.window_mask(rows, q.shape[1], k.shape[1], k.shape[1], causal, window_size), -torch.inf)
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
    return out.to(q.dtype), torch.logsumexp(scores, -1)


@pytest.mark.parametrize("drop", ["window_size", "softcap"])
def test_a_forward_that_ignores_the_window_or_the_softcap_fails_the_gate(drop):
    def ignoring(q, k, v, causal, **arguments):
        arguments.pop(drop)
        ref = gate.reference_attention(q, k, v, causal, dtype=q.dtype, **arguments)
        return ref.out.to(q.dtype), ref.lse

    q, k, v, _ = _inputs(GEMMA2)
    q = q * 8  # large scores: the soft-cap changes the softmax
    assert not gate.gate_forward(ignoring, q, k, v, True, **gate.call_arguments(GEMMA2)).passed


def test_the_timed_checks_row_reference_applies_them():
    q, k, v, _ = _inputs(GEMMA2)
    ref = gate.reference_attention(q, k, v, True, **gate.call_arguments(GEMMA2))
    rows = torch.tensor([0, 41, 95])
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=ref.out.bfloat16(), lse=ref.lse,
                                        **gate.call_arguments(GEMMA2)) == ""
    plain = gate.reference_attention(q, k, v, True)
    assert runtime_guards.rows_mismatch(q, k, v, True, rows, out=plain.out.bfloat16(), lse=plain.lse,
                                        **gate.call_arguments(GEMMA2)) != ""


def test_flops_count_the_keys_the_window_leaves():
    # upstream's bench_utils for a (4096, 0) window over 8192 tokens: rows 0-4095 see row + 1 keys, the rest 4097
    assert flops.average_seqlen_k(8192, 8192, False, 4096, 0) == 4097 * 0.75
    assert flops.average_seqlen_k(8192, 8192, True, 4096, -1) == 4097 * 0.75  # causal: right side 0
    assert flops.average_seqlen_k(8192, 8192, True) == 4096.0  # no window: upstream's causal average, unchanged
    rows = torch.arange(96)
    first, last = gate.key_range(rows, 96, 96, True, (40, 0))
    seen = (last - first + 1).sum().item()
    assert flops.problem_flops(GEMMA2, "fwd") == 1 * 4 * 2 * seen * 128
    assert flops.problem_flops(MISTRAL, "bwd") == 2.5 * flops.problem_flops(MISTRAL, "fwd")


def test_the_memory_floor_reads_only_the_keys_some_row_sees():
    decode = Problem(4, 1, 32768, 32, 8, 128, 128, True, window_size_left=4096, window_size_right=0, backward=False)
    plain = Problem(4, 1, 32768, 32, 8, 128, 128, True, backward=False)
    assert memory_floor.keys_seen(1, 32768, decode) == 4097
    assert memory_floor.traffic_bytes(decode, "fwd") < memory_floor.traffic_bytes(plain, "fwd") / 7
    assert memory_floor.traffic_bytes(MISTRAL, "fwd") == memory_floor.traffic_bytes(
        Problem(1, 8192, 8192, 32, 8, 128, 128, True), "fwd")  # every key is some row's


def test_sdpa_takes_a_window_and_refuses_a_softcap_in_one_line():
    sdpa = sdpa_candidate()
    windowed = Problem(1, 96, 64, 4, 2, 64, 64, True, window_size_left=20, window_size_right=0)
    q, k, v, _ = _inputs(windowed)
    out, _ = sdpa.forward(q.float(), k.float(), v.float(), True, **gate.call_arguments(windowed))
    ref = gate.reference_attention(q.float(), k.float(), v.float(), True, **gate.call_arguments(windowed))
    valid = ref.valid_rows[0, 0]  # rows that see a key (bottom-right: the first 32 see none)
    assert torch.allclose(out[:, valid], ref.out[:, valid], atol=1e-5)
    with pytest.raises(ConfigError, match="^sdpa_softcap: .*softcap=50"):
        sdpa.forward(q, k, v, True, **gate.call_arguments(GEMMA2))
