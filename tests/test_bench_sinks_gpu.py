"""bench/sinks_gpu.py (issue 71's GPU checks): its cases are the classes they claim, its gate passes the reference with
the sink and fails an output computed without it, its determinism count tells bit-identical runs from others, and a
bad step name is one line and exit 2 (the steps need a GPU: docs/measurements/data/2026-12-07-gpu-sinks.sh)."""

import torch

from bench import sinks_gpu
from fa4tune.config import Problem
from fa4tune.harness import gate

SMALL = sinks_gpu.Case("small", 2, 40, 56, 4, 2, 32)


def _class(case) -> str:
    return Problem(max(case.batch, 1), case.seqlen_q, case.seqlen_k, case.heads, case.heads_kv, case.head_dim,
                   case.head_dim, case.causal, window_size_left=case.window_left,
                   window_size_right=0 if case.window_left >= 0 else -1).problem_class.name


def test_the_cases_are_gpt_oss_s_shapes_and_the_classes_the_issue_names():
    names = [_class(c) for c in sinks_gpu.SINK_CASES]
    assert names == ["d64-causal-gqa8-bf16", "d64-causal-gqa8-window-bf16", "d64-causal-gqa8-bf16",
                     "d64-causal-gqa8-decode-bf16", "d128-causal-gqa4-bf16", "d128-noncausal-bf16"]
    assert all(c.sink for c in sinks_gpu.SINK_CASES) and [c.backward for c in sinks_gpu.SINK_CASES].count(False) == 1
    packed = [c for c in sinks_gpu.SINK_CASES + sinks_gpu.DETERMINISM_CASES if c.lengths]
    assert packed and all(len(c.lengths) == c.batch and max(c.lengths) == c.seqlen_q for c in packed)
    assert not any(c.window_left >= 0 for c in sinks_gpu.DETERMINISM_CASES)  # deterministic_local: refused there
    assert {_class(c) for c in sinks_gpu.DETERMINISM_CASES} >= {"d128-causal-gqa4-bf16", "d128-noncausal-bf16", "d96-causal-bf16"}


def test_the_gate_passes_the_reference_with_the_sink_and_fails_an_output_without_it():
    q, k, v, dout, sink = sinks_gpu.inputs(SMALL, device="cpu")
    ref, plain = sinks_gpu.references(SMALL, q, k, v, sink, dout)
    good = sinks_gpu.checks(ref, plain, ref.out.bfloat16(), ref.lse, (ref.dq, ref.dk, ref.dv, ref.dsink))
    assert [c.name for c in good] == ["out", "lse", "dq", "dk", "dv", "dsink"] and sinks_gpu.verdict(good) == "ok"
    sinkless = gate.reference_attention(q, k, v, True, dout=dout)
    bad = sinks_gpu.checks(ref, plain, sinkless.out.bfloat16(), sinkless.lse, (sinkless.dq, sinkless.dk, sinkless.dv,
                                                                                torch.zeros_like(ref.dsink)))
    assert {c.name for c in bad if not c.passed} == {"out", "lse", "dq", "dk", "dv", "dsink"}
    assert sinks_gpu.verdict(bad).startswith("out")


def test_a_packed_case_s_reference_is_each_sequence_alone_in_the_kernel_s_layouts():
    case = sinks_gpu.Case("packed", 2, 30, 30, 4, 2, 32, lengths=(10, 30))
    q, k, v, dout, sink = sinks_gpu.inputs(case, device="cpu")
    ref, _ = sinks_gpu.references(case, q, k, v, sink, dout)
    assert ref.out.shape == q.shape and ref.lse.shape == (4, 40) and ref.dk.shape == k.shape
    first = gate.reference_attention(q[None, :10], k[None, :10], v[None, :10], True, learnable_sink=sink, dout=dout[None, :10])
    second = gate.reference_attention(q[None, 10:], k[None, 10:], v[None, 10:], True, learnable_sink=sink, dout=dout[None, 10:])
    torch.testing.assert_close(ref.out[:10], first.out[0])
    torch.testing.assert_close(ref.lse[:, 10:], second.lse[0])
    torch.testing.assert_close(ref.dsink, first.dsink + second.dsink)


def test_distinct_counts_results_that_differ_in_a_single_bit():
    a = (torch.ones(4), torch.zeros(2))
    flipped = (torch.ones(4).view(torch.int32).bitwise_xor(torch.tensor([0, 0, 1, 0], dtype=torch.int32)).view(torch.float32),
               torch.zeros(2))
    assert sinks_gpu.distinct([a, tuple(t.clone() for t in a), a]) == 1
    assert sinks_gpu.distinct([a, flipped, a]) == 2


def test_a_bad_step_is_one_line_and_exit_2(capsys):
    assert sinks_gpu.main(["nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
