"""Packed batches of mixed lengths (varlen, issue #42 item 3): `attention()` takes cu_seqlens_q / cu_seqlens_k, the
class is its longest sequences', the entry runs where its kernel class runs packed batches (`varlen`), else its knobs
on upstream's class; bad packing gets one error naming the rule; forward and backward compile for sm_120a."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import experiment
from fa4tune import defaults
from fa4tune.api import DispatchTables, packing, problem_class_of
from fa4tune.config import ConfigError, ProblemClass
from fa4tune.kernel_class import forward_kernels, runs_varlen

ROOT = Path(__file__).resolve().parent.parent


def _packed(lengths, heads=4, kv_heads=4, d=64):
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(offsets[-1])
    q = torch.zeros(total, heads, d, dtype=torch.bfloat16)
    k = torch.zeros(total, kv_heads, d, dtype=torch.bfloat16)
    return q, k, offsets


def test_a_packed_batch_is_classed_by_its_longest_sequences():
    q, k, cu = _packed([100, 3000, 7], heads=16, kv_heads=4, d=128)
    found = packing(q, k, cu, cu, None, None)
    assert (found.max_seqlen_q, found.max_seqlen_k) == (3000, 3000)  # read from the offsets when not given
    assert problem_class_of(q, k, k, True, found.max_seqlen_q, found.max_seqlen_k).name == "d128-causal-gqa4-bf16"
    assert packing(q, k, None, None, None, None) is None  # padded tensors: no packing
    given = packing(q, k, cu, cu, 4096, 4096)  # given lengths are taken as they are (no device-to-host copy)
    assert given.max_seqlen_q == 4096


@pytest.mark.parametrize("args, rule, words", [
    (dict(cu_k=None), "varlen_cu_seqlens", "needs both"),
    (dict(cu_q="int64"), "varlen_cu_seqlens", "int32"),
    (dict(cu_k="short"), "varlen_cu_seqlens", "same length"),
    (dict(padded=True), "varlen_layout", "(total, heads, head_dim)"),
])
def test_bad_packing_gets_one_error_naming_the_rule(args, rule, words):
    q, k, cu = _packed([5, 9])
    cu_q, cu_k = cu, cu
    if args.get("cu_k", "") is None:
        cu_k = None
    if args.get("cu_q") == "int64":
        cu_q = cu.to(torch.int64)
    if args.get("cu_k") == "short":
        cu_k = cu[:-1]
    if args.get("padded"):
        q, k = q[None], k[None]
    with pytest.raises(ConfigError) as refused:
        packing(q, k, cu_q, cu_k, None, None)
    assert refused.value.rule == rule and words in str(refused.value)


def test_only_classes_that_declare_it_run_packed_batches_and_the_declaration_is_not_inherited():
    kernels = forward_kernels(experiment)
    assert runs_varlen(kernels["sm120"])  # upstream's code (SeqlenInfo, the varlen scheduler)
    assert not any(runs_varlen(cls) for name, cls in kernels.items() if name != "sm120")  # TMA and split-KV subclasses


def test_a_packed_call_runs_its_varlen_entry_else_its_entry_on_a_packed_class_else_upstream_s_default():
    tables = experiment.TABLES
    gqa = ProblemClass.parse("d128-causal-gqa4-bf16")  # a TMA (trimmed) entry, a varlen entry measured on packed batches
    assert tables.forward_config(gqa).kernel == "sm120_tma_trimmed"
    assert tables.varlen_forward_config(gqa) is experiment.VARLEN_DISPATCH[gqa.name]
    plain = ProblemClass.parse("d128-noncausal-bf16")  # an entry on upstream's class runs as it is
    assert tables.varlen_forward_config(plain) is tables.forward_config(plain)
    for name in ("d64-causal-bf16", "d128-noncausal-gqa4-decode-bf16"):  # TMA trimmed, split-KV: no knobs carried over
        pc = ProblemClass.parse(name)
        assert tables.forward_config(pc).kernel != "sm120"
        assert tables.varlen_forward_config(pc) == defaults.upstream_forward(pc)


def test_a_varlen_entry_on_a_class_that_cannot_run_packed_batches_gets_one_error_naming_the_rule():
    pc = ProblemClass.parse("d128-causal-gqa4-bf16")
    bad = replace(experiment.FORWARD_DISPATCH[pc.name], kernel="sm120_tma_lpt")
    tables = DispatchTables(experiment.FORWARD_DISPATCH, experiment.BACKWARD_DISPATCH, {}, experiment.kernel_class,
                            varlen={pc.name: bad})
    with pytest.raises(ConfigError) as refused:
        tables.varlen_forward_config(pc)
    assert refused.value.rule == "varlen_entry" and "'sm120_tma_lpt' does not run packed batches" in str(refused.value)
    too_big = replace(experiment.VARLEN_DISPATCH[pc.name], tile_m=256, tile_n=128, num_stages=2)
    with pytest.raises(ConfigError) as refused:
        DispatchTables({}, {}, {}, experiment.kernel_class, varlen={pc.name: too_big}).varlen_forward_config(pc)
    assert refused.value.rule == "smem_capacity" and "varlen entry" in str(refused.value)


def test_packed_forward_and_backward_compile_for_sm120a_with_the_tuned_configs(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "varlen_probe.py"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    gqa = report["gqa4 d128 causal"]
    assert gqa["class"] == "d128-causal-gqa4-bf16" and gqa["entry"] == "sm120_tma_trimmed"
    assert gqa["out"] == [300 + 1000 + 77 + 2048, 16, 128]
    # the compiled kernels: the class's varlen entry (upstream's class), then its backward entry
    fwd, bwd = gqa["kernels"]
    assert fwd[0] == "ForwardConfig" and fwd[-1] == "sm120" and fwd[1:6] == [64, 64, 128, 1, True]
    assert bwd[0] == "BackwardConfig"


def _stand_in(q, k, v, causal, lengths, across=False):
    """Packed attention on the CPU, one sequence at a time (or, `across`, the whole batch as one sequence: the
    mistake a kernel that ignores cu_seqlens makes); returns out (total, h, d) and lse (h, total)."""
    from fa4tune.harness.gate import reference_attention

    bounds = [0, sum(lengths)] if across else [0, *torch.tensor(lengths).cumsum(0).tolist()]
    outs, lses = [], []
    for start, stop in zip(bounds, bounds[1:]):
        ref = reference_attention(q[start:stop][None], k[start:stop][None], v[start:stop][None], causal)
        outs.append(ref.out[0].to(q.dtype))
        lses.append(ref.lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def test_the_per_sequence_gate_passes_packed_attention_and_names_the_sequence_a_boundary_leak_breaks():
    from bench.varlen import check_packed

    lengths = (5, 17, 33)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), 2, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    out, lse = _stand_in(q, k, v, True, lengths)
    assert check_packed(q, k, v, True, lengths, out, lse) == []
    leaked, leaked_lse = _stand_in(q, k, v, True, lengths, across=True)  # later sequences see earlier ones' keys
    failures = check_packed(q, k, v, True, lengths, leaked, leaked_lse)  # the first failing sequence, named
    assert len(failures) == 1 and failures[0].startswith("packed, sequence 1 of 3 (length 17) (packed 3 seqs 55 tokens")
    # gradients: per sequence too (a dQ left at zero in the last sequence fails it alone)
    dout = torch.randn(q.shape, generator=g).to(torch.bfloat16)
    grads = []
    for start, stop in zip([0, 5, 22], [5, 22, 55]):
        qs, ks, vs = (t[start:stop].float().requires_grad_() for t in (q, k, v))
        scores = (qs.transpose(0, 1) @ ks.transpose(0, 1).transpose(1, 2)) / 32 ** 0.5
        mask = torch.ones(stop - start, stop - start, dtype=torch.bool).tril()
        o = (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vs.transpose(0, 1)).transpose(0, 1)
        grads.append(torch.autograd.grad(o, (qs, ks, vs), dout[start:stop].float()))
    dq, dk, dv = (torch.cat([g_[i] for g_ in grads]).to(torch.bfloat16) for i in range(3))
    assert check_packed(q, k, v, True, lengths, out, lse, (dq, dk, dv), dout) == []
    dq[22:] = 0
    failures = check_packed(q, k, v, True, lengths, out, lse, (dq, dk, dv), dout)
    assert len(failures) == 1 and failures[0].startswith("packed, sequence 2 of 3 (length 33)") and "): dq max error" in failures[0]


def test_the_speedup_is_the_median_of_paired_ratios_over_two_rounds_of_opposite_order_with_its_quartiles():
    from bench.varlen import paired_speedup

    # a drift that doubles both calls' times in the later rounds cancels in each round's ratio
    assert paired_speedup([2.0, 2.0, 4.0, 4.0], [1.0, 1.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    # the same kernel twice, the call in second place 30 % slower (the order reversed every other round): 1.0
    assert paired_speedup([1.0, 1.3] * 3, [1.3, 1.0] * 3) == pytest.approx((1.0, 1.0, 1.0))
    median, q1, q3 = paired_speedup([1.1, 1.1, 1.2, 1.2, 1.3, 1.3], [1.0] * 6)
    assert (median, q1, q3) == pytest.approx((1.2, 1.15, 1.25))
    assert paired_speedup([3.0], [2.0]) == (1.5, 1.5, 1.5)


def test_identical_calls_read_even_when_a_call_runs_slower_first_in_a_round_or_after_the_other_side():
    from bench.varlen import _timed, paired_speedup

    # A fake clock where a call is 20 % slower when it opens its round and 10 % slower after a call of the other side:
    # the two sides run the same work, so any speedup but 1.0 is the design's bias.
    log = []

    def clock(fn):
        name, shape = fn()
        ms = 1.0
        if sum(s == shape for _, s in log) % 2 == 0:  # two warm-ups, then rounds of two
            ms *= 1.2
        if log and log[-1][1] == shape and log[-1][0] != name:
            ms *= 1.1
        log.append((name, shape))
        return ms

    pairs = {shape: {name: (lambda n=name, s=shape: (n, s)) for name in ("table", "upstream")} for shape in ("varlen", "fwd")}
    times = _timed(pairs, 8, clock)
    assert [len(times[s][n]) for s in pairs for n in ("table", "upstream")] == [8] * 4
    assert [n for n, s in log[:6]] == ["upstream", "table", "table", "upstream", "upstream", "table"]  # B A, A B, B A
    for shape in pairs:
        assert paired_speedup(times[shape]["upstream"], times[shape]["table"]) == pytest.approx((1.0, 1.0, 1.0))
