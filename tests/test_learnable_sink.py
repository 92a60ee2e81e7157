"""Learnable sinks and the deterministic backward (issue 71): the gate's fp32 reference with a sink against attention
written out (d(sink) by autograd), the kernels' fold of the sink checked as math, the drop-in routing both to our op
with one error naming the rule for a malformed sink, `deterministic` as the backward classes' call knob, and sm_120a
compiles of the sink forward, the sink backward and the deterministic backward against the plain kernels."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import experiment
from fa4tune import api, defaults, dropin, torch_op
from fa4tune.config import BackwardConfig, ConfigError, Problem, ProblemClass
from fa4tune.feasibility import check_backward
from fa4tune.harness import gate
from fa4tune.kernel_class import backward_kernels, forward_kernels, runs_features
from fa4tune.targets import get_target

ROOT = Path(__file__).resolve().parent.parent


def _inputs(sq, sk, heads=4, heads_kv=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, n, h, d, generator=g, dtype=torch.float64) for n, h in ((sq, heads), (sk, heads_kv), (sk, heads_kv)))
    sink = torch.randn(heads, generator=g, dtype=torch.float64) * 2
    return q, k, v, sink, torch.randn(2, sq, heads, d, generator=g, dtype=torch.float64)


def _written_out(q, k, v, sink, causal):
    """Attention with a sink column, all rows at once in fp64, differentiable in everything (torch's autograd)."""
    b, sq, h, d = q.shape
    sk, group = k.shape[1], h // k.shape[2]
    s = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(group, 2)) / d ** 0.5
    if causal:  # bottom-right aligned: row i sees keys j <= i + sk - sq
        s = s.masked_fill(torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq, float("-inf"))
    lse = torch.logsumexp(torch.cat([s, sink[None, :, None, None].expand(b, h, sq, 1)], dim=-1), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", torch.exp(s - lse[..., None]), v.repeat_interleave(group, 2)), lse


@pytest.mark.parametrize("causal, sq, sk", [(True, 40, 40), (True, 48, 24), (False, 33, 57)])
def test_the_gate_s_reference_with_a_sink_is_attention_written_out_with_the_sink_s_gradient(causal, sq, sk):
    # (True, 48, 24): the first 24 rows see no key (bottom-right causal) and hold the sink alone: out 0, lse = sink
    q, k, v, sink, dout = _inputs(sq, sk)
    ref = gate.reference_attention(q, k, v, causal, learnable_sink=sink, dout=dout, chunk_bytes=4096, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sink)]
    out, lse = _written_out(*leaves, causal)
    grads = torch.autograd.grad(out, leaves, dout)
    for name, got, want in (("out", ref.out, out), ("lse", ref.lse, lse), ("dq", ref.dq, grads[0]), ("dk", ref.dk, grads[1]),
                            ("dv", ref.dv, grads[2]), ("dsink", ref.dsink, grads[3])):
        torch.testing.assert_close(got.double(), want.detach(), atol=1e-5, rtol=1e-5, msg=name)
    assert ref.valid_rows.all()  # with a sink every row has a finite LSE
    if sq > sk and causal:
        assert torch.equal(ref.out[:, : sq - sk], torch.zeros_like(ref.out[:, : sq - sk]))
        torch.testing.assert_close(ref.lse[:, :, 0], sink.float().expand(2, -1))


def test_d_sink_is_minus_the_sink_s_share_times_rowsum_of_dout_times_out():
    # what upstream's dQ postprocess reduces (flash_bwd_postprocess.dsink_row_term), with the preprocess's D = rowsum(dO O)
    q, k, v, sink, dout = _inputs(40, 40)
    ref = gate.reference_attention(q, k, v, True, learnable_sink=sink, dout=dout, dtype=torch.float64, chunk_bytes=4096)
    share = torch.exp(sink[None, :, None] - ref.lse.double())  # (b, h, sq)
    rowsum = (dout * ref.out).sum(-1).transpose(1, 2)  # (b, h, sq)
    torch.testing.assert_close(ref.dsink.double(), -(share * rowsum).sum((0, 2)), atol=1e-6, rtol=1e-6)


def test_folding_the_sink_into_a_finished_row_is_the_reference_with_the_sink():
    # the kernels' fold (TunedForwardSm120.fold_learnable_sink): l' = log(e^l + e^s), O' = O e^(l - l'), on rows that
    # see keys and on rows that see none (l = -inf: O stays 0, l' = s)
    q, k, v, sink, _ = _inputs(48, 24)
    plain = gate.reference_attention(q, k, v, True, dtype=torch.float64)
    with_sink = gate.reference_attention(q, k, v, True, learnable_sink=sink, dtype=torch.float64)
    lse = plain.lse.double()
    folded_lse = torch.logaddexp(lse, sink[None, :, None].expand_as(lse))
    folded_out = plain.out * torch.exp(lse - folded_lse).transpose(1, 2)[..., None]
    torch.testing.assert_close(folded_lse, with_sink.lse.double())
    torch.testing.assert_close(folded_out, with_sink.out)


# ---- the drop-in and the op ----

def _tensors(seqlen_q=128, seqlen_k=128, heads=4, heads_kv=2, head_dim=64, device="cpu"):
    q = torch.zeros(2, seqlen_q, heads, head_dim, dtype=torch.bfloat16, device=device)
    k = torch.zeros(2, seqlen_k, heads_kv, head_dim, dtype=torch.bfloat16, device=device)
    return q, k, k.clone()


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    from flash_attn.cute import interface

    monkeypatch.setattr(interface, "flash_attn_func", lambda **kw: pytest.fail("upstream's function ran"))
    monkeypatch.setattr(torch_op, "forward_op", lambda *args: calls.append(args) or ("ours", "lse"))
    return calls


def test_a_sink_and_deterministic_reach_our_op_not_upstream_s(op_calls):
    q, k, v = _tensors()
    sink = torch.zeros(4)
    assert dropin.flash_attn_func(q, k, v, learnable_sink=sink, deterministic=True) == ("ours", None)
    (args,) = op_calls
    assert args[-2] is sink and args[-1] is True
    assert "learnable_sink" not in dropin.UPSTREAM_ONLY and "deterministic" not in dropin.UPSTREAM_FLAGS


@pytest.mark.parametrize("sink, rule, value", [
    (torch.zeros(5), "learnable_sink_shape", "(5,)"), (torch.zeros(1, 4), "learnable_sink_shape", "(1, 4)"),
    (torch.zeros(4, dtype=torch.float64), "learnable_sink_dtype", "torch.float64"),
    (torch.zeros(4, dtype=torch.int32), "learnable_sink_dtype", "torch.int32"),
    (torch.zeros(4, device="meta"), "learnable_sink_device", "meta"), ([0.0] * 4, "learnable_sink_tensor", "list")])
def test_a_malformed_sink_is_one_error_naming_the_rule_and_the_value(sink, rule, value, op_calls):
    with pytest.raises(ConfigError) as caught:
        dropin.flash_attn_func(*_tensors(), learnable_sink=sink)
    assert caught.value.rule == rule and value in str(caught.value) and op_calls == []


@pytest.fixture
def host_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "run_forward", lambda *args: calls.append(args) or ("out", "lse"))
    monkeypatch.setattr(api, "run_backward", lambda *args: calls.append(args) or ("dq", "dk", "dv", "dsink"))
    torch_op.use_tables(experiment.TABLES)
    yield calls
    torch_op._TABLES.clear()
    torch_op._MEMO.clear()


def _forward(q, k, v, sink, causal=True):
    return torch_op.tuned_forward(q, k, v, None, None, None, None, None, None, None, None, causal, None, None, 0.0, 1, None,
                                  False, sink)


def test_a_sink_call_runs_the_class_s_entry_where_its_kernel_folds_the_sink(host_calls, caplog):
    sink = torch.zeros(2)
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _forward(*_tensors(heads=2), sink)
    (kernel_class, *_, config, packed, extras), = host_calls
    assert config == experiment.FORWARD_DISPATCH["d64-causal-bf16"] and extras.learnable_sink is sink
    assert "learnable_sink" in runs_features(kernel_class(config)) and "runs its own entry" in caplog.text


def test_every_forward_class_folds_the_sink_but_fp8():
    sinkless = {name for name, cls in forward_kernels().items() if "learnable_sink" not in runs_features(cls)}
    assert sinkless == {"sm120_fp8"}


def test_a_sink_decode_runs_the_decode_entry_on_the_split_kv_class(host_calls, caplog):
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _forward(*_tensors(seqlen_q=1, seqlen_k=4096), torch.zeros(4))
    (*_, config, packed, extras), = host_calls
    assert config.kernel == "sm120_splitkv" and "upstream's SM120 config" not in caplog.text


def _backward(q, k, v, sink=None, deterministic=False, window=(None, None), causal=True):
    return torch_op.tuned_backward(q, q, k, v, q, None, None, None, None, None, None, None, None, None, causal, *window,
                                   0.0, sink, deterministic)


def test_deterministic_runs_the_class_s_backward_entry_with_the_call_knob_set(host_calls, caplog):
    q, k, v = _tensors(heads=2, seqlen_q=1024, seqlen_k=1024)
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _backward(q, k, v)
        _backward(q, k, v, deterministic=True)
    (*_, plain, _, _, _, _), (*_, ordered, _, _, _, _) = host_calls
    assert plain == experiment.BACKWARD_DISPATCH["d64-causal-bf16"]
    assert ordered == replace(plain, extra={"deterministic": True}) and api.is_deterministic(ordered)
    assert "deterministic (dQ in key-block order)" in caplog.text


def test_a_sink_backward_hands_the_sink_to_the_host_and_returns_its_gradient(host_calls):
    q, k, v = _tensors(heads=2, seqlen_q=1024, seqlen_k=1024)
    sink = torch.zeros(2)
    dq, dk, dv, dsink = _backward(q, k, v, sink)
    (*_, config, threads, packed, extras, dlse), = host_calls
    assert extras.learnable_sink is sink and dsink == "dsink"
    assert config == experiment.BACKWARD_DISPATCH["d64-causal-bf16"]  # the backward kernel needs nothing of the sink


def test_deterministic_with_a_sliding_window_is_one_error_naming_the_rule(host_calls):
    q, k, v = _tensors(heads=2, seqlen_q=1024, seqlen_k=1024)
    with pytest.raises(ConfigError) as caught:
        _backward(q, k, v, deterministic=True, window=(256, 0))
    assert caught.value.rule == "deterministic_local" and "d64-causal-window-bf16" in str(caught.value)
    assert host_calls == []


def test_torch_compile_fullgraph_traces_a_sink_call_and_the_sink_s_gradient_flows():
    def layer(q, k, v, sink):
        out, lse = dropin.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, deterministic=True, return_lse=True)
        return out.float().sum() + lse.sum()

    q, k, v = (t.to("meta").requires_grad_() for t in _tensors(seqlen_q=256, seqlen_k=256))
    sink = torch.zeros(4, device="meta", requires_grad=True)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(q, k, v, sink)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    torch.compile(layer, fullgraph=True, backend="aot_eager")(q, k, v, sink).backward()
    assert sink.grad.shape == sink.shape and q.grad.shape == q.shape


def test_the_op_s_schema_takes_the_sink_and_deterministic_and_passes_torch_s_checks():
    q, k, v = (t.to("meta") for t in _tensors())
    args = (q, k, v, None, None, None, None, None, None, None, None, True, None, None, 0.0, 1, None, True,
            torch.zeros(4, device="meta"), True)
    torch.library.opcheck(torch.ops.fa4tune.fwd.default, args, test_utils=("test_schema",))
    out, lse = torch.ops.fa4tune.fwd(*args)
    assert out.shape == q.shape and lse.shape == (2, 4, 128)


# ---- deterministic: a call knob of the backward classes ----

D128 = ProblemClass(128, 128, True, 4)


@pytest.mark.parametrize("kernel", sorted(backward_kernels()))
def test_every_backward_class_takes_deterministic_as_a_call_knob(kernel):
    cls = backward_kernels()[kernel]
    pc = D128 if kernel != "sm120_edge" else ProblemClass(128, 128, False, 4)
    entry = replace(experiment.backward_config(pc) if kernel != "sm120" else defaults.upstream_backward(pc), kernel=kernel)
    assert cls.call_knobs == {"deterministic": (False, True)} and "deterministic" not in cls.knobs
    assert check_backward(entry, pc, get_target())  # absent: False, as every table entry is
    for value in (False, True):
        assert check_backward(replace(entry, extra={"deterministic": value}), pc, get_target())
    bad = check_backward(replace(entry, extra={"deterministic": "yes"}), pc, get_target())
    assert bad.rule == "kernel_knobs" and "'yes'" in bad.message


def test_the_ordered_dq_helpers_take_the_turn_after_the_dq_gemm_and_give_it_back_before_the_next_gemm(monkeypatch):
    # the trace-time order of kernels/backward_sm120.py's deterministic body: dQ's atomic adds (which follow the dQ gemm
    # in upstream's body) sit between the turn taken and the turn given back; no other gemm does
    from kernels import backward_sm120

    events = []
    monkeypatch.setattr(backward_sm120, "acquire_turn", lambda lock, turn: events.append(("acquire", lock, turn)))
    monkeypatch.setattr(backward_sm120, "release_turn", lambda lock: events.append(("release", lock)))
    helpers = type("Helpers", (), {"gemm": lambda self, *a, **k: events.append(("gemm", a[3])), "other": 7})()
    tdQrK = object()
    ordered = backward_sm120._OrderedDQ(helpers, tdQrK, "lock", 3)
    ordered.gemm("mma", "acc", "dS", "dV operand")
    ordered.gemm("mma", "acc", "dS", tdQrK, hook_fn=None)
    assert ordered.pending and events[-1] == ("acquire", "lock", 3)
    ordered.gemm("mma", "acc", "dS", "dK operand")
    assert events == [("gemm", "dV operand"), ("gemm", tdQrK), ("acquire", "lock", 3), ("release", "lock"),
                      ("gemm", "dK operand")]
    assert not ordered.pending and ordered.other == 7  # everything else is the helpers' own


def test_the_search_never_draws_deterministic():
    from search.space import backward_space

    space = backward_space()
    assert "deterministic" not in space.domain
    assert all("deterministic" not in knobs for knobs in space.kernel_knobs.values())


def test_the_host_edits_let_the_sink_and_deterministic_through_on_sm120():
    from fa4tune.sm120_interface import BACKWARD_EDITS, build, edit_problems

    assert edit_problems() == {}
    edits = {what: new for _, new, what in BACKWARD_EDITS}
    assert "_fa4tune_check_deterministic(sm120_config, deterministic)" in edits["backward deterministic"]
    host = build(experiment.kernel_class)
    check = host.flash_attn_bwd.__globals__["_fa4tune_check_deterministic"]
    check(replace(BackwardConfig(), extra={"deterministic": True}), True)
    with pytest.raises(ValueError, match="deterministic_knob"):
        check(BackwardConfig(), True)


# ---- compiles (sm_120a, fake tensors) ----

def _probe(jobs, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sink_probe.py"), str(tmp_path)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("PROBE ", 1)[1])


@pytest.mark.compile
def test_the_sink_forward_the_sink_backward_and_the_deterministic_backward_compile_for_sm120(tmp_path):
    """The sink folds into the entries' forwards (upstream's kernel body: d128 causal; the TMA class: d128 causal
    GQA 4, packed; the split-KV class: a GQA 4 decode, split 0's partial) with no more shared memory or spills
    than the plain kernel; the sink's backward is the
    plain kernel (only the host's postprocess changes); the deterministic backward of the causal GQA 4 entry (two Q
    stages: dQ and dK/dV ordered) and of the d96 causal one (one Q stage) compile without spills, under 99 KB."""
    jobs, smem_limit = [], get_target().smem_per_block
    for name, seqlen_q in (("d128-causal-bf16", 1024), ("d128-causal-gqa4-bf16", 1024), ("d128-causal-gqa4-decode-bf16", 1)):
        pc = ProblemClass.parse(name)
        problem = Problem(1, seqlen_q, 4096 if seqlen_q == 1 else 1024, 2 * pc.qhead_per_kvhead, 2, 128, 128, True)
        for sink in (False, True):
            jobs.append({"kind": "fwd", "config": experiment.forward_config(pc).to_dict(), "problem": problem.to_dict(),
                         "sink": sink})
    gqa = Problem(1, 1024, 1024, 8, 2, 128, 128, True)
    d96 = Problem(1, 1024, 1024, 2, 2, 96, 96, True)
    for problem, extra in ((gqa, {}), (gqa, {"sink": True}), (gqa, {"deterministic": True}), (d96, {"deterministic": True})):
        config = experiment.backward_config(problem.problem_class)
        if extra.get("deterministic"):
            config = replace(config, extra={"deterministic": True})
        jobs.append({"kind": "bwd", "config": config.to_dict(), "problem": problem.to_dict(), **extra})
    plain, sink, plain_gqa, sink_gqa, plain_split, sink_split, bwd, bwd_sink, det_gqa, det_d96 = _probe(jobs, tmp_path)
    for before, after in ((plain, sink), (plain_gqa, sink_gqa), (plain_split, sink_split)):
        assert before["compiled"] == after["compiled"] == 1 and after["outputs"] == 2
        assert after["dynamic_smem_bytes"] == before["dynamic_smem_bytes"] <= smem_limit
        assert after["registers"] <= 255 and after["spill_store_bytes"] <= before["spill_store_bytes"]
        assert after["lg2"] > before["lg2"]  # the fold's log, per row
    assert bwd_sink == {"compiled": 0, "outputs": 4}  # dq, dk, dv, dsink: the plain kernel, found in the cache
    assert (det_gqa["acquire_loads"], det_gqa["release_adds"]) == (2, 2)  # dQ's turn and the KV head's dK/dV turn
    assert (det_d96["acquire_loads"], det_d96["release_adds"]) == (1, 1)
    assert bwd["acquire_loads"] == bwd["release_adds"] == 0
    for facts in (det_gqa, det_d96):
        assert facts["spill_store_bytes"] == facts["stack_bytes"] == 0 and facts["registers"] <= 255
        assert facts["dynamic_smem_bytes"] <= smem_limit
    assert det_gqa["dynamic_smem_bytes"] == bwd["dynamic_smem_bytes"]  # the counters live in global memory
