"""fa4tune.dropin's flash_attn_func / flash_attn_varlen_func (issue 69): upstream's parameters exactly, our tuned custom op where
our kernels run the call, upstream's own function with the same arguments where they do not, a debug line saying
which and why; the op traces whole under torch.compile(fullgraph=True) (meta tensors: no GPU needed)."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch

import experiment
from fa4tune import api, dropin, torch_op
from fa4tune.config import ForwardConfig, ProblemClass

FUNCTIONS = ("flash_attn_func", "flash_attn_varlen_func")


def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_the_signatures_are_the_pinned_release_s(name):
    from flash_attn.cute import interface

    assert _parameters(getattr(dropin, name)) == _parameters(getattr(interface, name))


def test_the_package_names_them_on_first_use_and_import_fa4tune_stays_light():
    # fa4tune.__getattr__ (PEP 562): `import fa4tune` imports no torch; the names are fa4tune.dropin's own functions
    import json
    import subprocess
    import sys

    code = ("import json, sys, fa4tune\n"
            "light = 'torch' not in sys.modules and 'fa4tune.dropin' not in sys.modules\n"
            "import fa4tune.dropin as d\n"
            "print(json.dumps({'light': light, 'same': [getattr(fa4tune, n) is getattr(d, n) for n in fa4tune.DROPIN],\n"
            "                  'listed': set(fa4tune.DROPIN) <= set(dir(fa4tune))}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"light": True, "same": [True, True], "listed": True}
    import fa4tune

    assert fa4tune.DROPIN == FUNCTIONS
    assert _parameters(fa4tune.flash_attn_func) == _parameters(dropin.flash_attn_func)
    with pytest.raises(AttributeError, match="no attribute 'flash_attn'"):
        fa4tune.flash_attn


def _tensors(device="cpu", seqlen_q=128, seqlen_k=128, heads=4, heads_kv=2, head_dim=64, dtype=torch.bfloat16):
    q = torch.zeros(2, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k = torch.zeros(2, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    return q, k, k.clone()


@pytest.fixture
def upstream_calls(monkeypatch):
    from flash_attn.cute import interface

    calls = []
    for name in FUNCTIONS:
        monkeypatch.setattr(interface, name, lambda _name=name, **kw: calls.append((_name, kw)) or ("upstream", None))
    return calls


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(torch_op, "forward_op", lambda *args: calls.append(args) or ("ours", "lse"))
    return calls


CASES = [(name, flag) for name in FUNCTIONS for flag in (*dropin.UPSTREAM_ONLY, *dropin.UPSTREAM_FLAGS)
         if flag in inspect.signature(getattr(dropin, name)).parameters]


@pytest.mark.parametrize("name, argument", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_an_argument_our_kernels_do_not_run_goes_to_upstream_s_function_unchanged(name, argument, upstream_calls, op_calls,
                                                                                   caplog):
    q, k, v = _tensors()
    value = True if argument in dropin.UPSTREAM_FLAGS else object()
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        result = getattr(dropin, name)(q, k, v, causal=True, **{argument: value})
    assert result == ("upstream", None) and op_calls == []
    (called, arguments), = upstream_calls
    assert called == name and arguments[argument] is value and arguments["q"] is q and arguments["causal"] is True
    assert set(arguments) == set(inspect.signature(getattr(dropin, name)).parameters)  # every argument, as given
    assert f"upstream's {name}: {argument}" in caplog.text


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(dtype=torch.float8_e4m3fn), "dtype"), (dict(head_dim=36), "head dims"),
])
def test_inputs_our_kernels_do_not_take_go_to_upstream(kwargs, phrase, upstream_calls, op_calls, caplog):
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        dropin.flash_attn_func(*_tensors(**kwargs))
    assert len(upstream_calls) == 1 and op_calls == [] and phrase in caplog.text


def test_a_one_sided_packing_goes_to_upstream(upstream_calls, op_calls):
    q, k, v = _tensors()
    dropin.flash_attn_varlen_func(q[0], k, v, cu_seqlens_q=torch.tensor([0, 128], dtype=torch.int32))
    assert len(upstream_calls) == 1 and op_calls == []


def test_window_softcap_seqused_pack_gqa_and_splits_reach_our_op(upstream_calls, op_calls):
    q, k, v = _tensors(seqlen_q=1, seqlen_k=4096)
    used = torch.tensor([100, 4000], dtype=torch.int32)
    out, lse = dropin.flash_attn_varlen_func(q, k, v, seqused_k=used, causal=True, window_size=(1024, 0), softcap=50.0,
                                              num_splits=4, pack_gqa=False, softmax_scale=0.1)
    assert upstream_calls == [] and (out, lse) == ("ours", None)  # lse only with return_lse, as upstream's
    (args,) = op_calls
    assert args[:3] == (q, k, v) and args[6] is used and args[7] is None  # no page table
    assert args[10:] == (0.1, True, 1024, 0, 50.0, 4, False, False, None, False)  # no sink, not deterministic
    assert dropin.flash_attn_func(q, k, v, return_lse=True) == ("ours", "lse")


@pytest.fixture
def host_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "run_forward", lambda *args: calls.append(args) or ("out", "lse"))
    monkeypatch.setattr(api, "run_backward", lambda *args: calls.append(args) or ("dq", "dk", "dv"))
    torch_op.use_tables(experiment.TABLES)
    yield calls
    torch_op._TABLES.clear()
    torch_op._MEMO.clear()


def _forward(q, k, v, causal=True, window=(None, None), softcap=0.0, seqused_k=None, num_splits=1):
    return torch_op.tuned_forward(q, k, v, None, None, None, seqused_k, None, None, None, None, causal, *window, softcap,
                                  num_splits, None, False)


def test_a_class_with_an_entry_runs_it_and_says_so(host_calls, caplog):
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _forward(*_tensors(heads=2, seqlen_q=1024, seqlen_k=1024))
    (kernel_class, *_, config, packed, extras), = host_calls
    assert kernel_class is experiment.kernel_class and packed is None
    assert config == experiment.FORWARD_DISPATCH["d64-causal-bf16"]
    assert "tuned forward d64-causal-bf16" in caplog.text and "runs its own entry" in caplog.text


def test_a_window_and_softcap_class_runs_a_config_whose_kernel_runs_both(host_calls, caplog):
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _forward(*_tensors(heads=2, seqlen_q=1024, seqlen_k=1024), window=(256, 0), softcap=50.0)
    (*_, config, packed, extras), = host_calls
    assert config.kernel == "sm120" and (extras.window_size_left, extras.window_size_right, extras.softcap) == (256, 0, 50.0)
    assert "d64-causal-window-softcap-bf16" in caplog.text


def test_an_explicit_split_count_runs_the_split_kv_class_with_it(host_calls):
    _forward(*_tensors(seqlen_q=1, seqlen_k=4096), num_splits=8)
    (*_, config, packed, extras), = host_calls
    assert config.kernel == "sm120_splitkv" and config.extra_knobs == {"num_splits": 8}


def _forward_q(q, k, v, seqused_q):
    return torch_op.tuned_forward(q, k, v, None, None, seqused_q, None, None, None, None, None, True, None, None, 0.0, 1,
                                  None, False)


def test_a_kv_cache_decode_with_seqused_k_runs_the_split_kv_entry(host_calls, caplog):
    # the split-KV class reads seqused_k (feature "seqused"): the decode class's own entry runs it
    used = torch.tensor([100, 4000], dtype=torch.int32)
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _forward(*_tensors(seqlen_q=1, seqlen_k=4096), seqused_k=used)
    (kernel_class, *_, config, packed, extras), = host_calls
    from fa4tune.kernel_class import runs_features

    pc = "d64-causal-gqa2-decode-bf16"
    assert config == experiment.TABLES.forward_config(ProblemClass.parse(pc)) and config.kernel == "sm120_splitkv"
    assert "seqused" in runs_features(kernel_class(config)) and extras.seqused_k is used
    assert f"tuned forward {pc}: {config.short()}" in caplog.text and "upstream's SM120 config" not in caplog.text


def test_seqused_q_runs_a_config_whose_kernel_reads_it(host_calls, caplog):
    # the split-KV class writes dense partial rows (no seqused_q): upstream's SM120 config runs such a decode
    with caplog.at_level(logging.DEBUG, logger="fa4tune"):
        _forward_q(*_tensors(seqlen_q=1, seqlen_k=4096), torch.tensor([1, 0], dtype=torch.int32))
    (kernel_class, *_, config, packed, extras), = host_calls
    from fa4tune.kernel_class import runs_features

    assert config.kernel == "sm120" and "seqused_q" in runs_features(kernel_class(config))
    assert "its kernel does not run seqused_q: upstream's SM120 config" in caplog.text


def test_the_backward_of_a_window_class_runs_a_backward_kernel_that_runs_windows(host_calls):
    q, k, v = _tensors(heads=2, seqlen_q=1024, seqlen_k=1024)
    torch_op.tuned_backward(q, q, k, v, q, None, None, None, None, None, None, None, None, None, True, 256, 0, 0.0)
    (*_, config, threads, packed, extras, dlse), = host_calls
    assert config.kernel == "sm120" and extras.window_size_left == 256 and dlse is None


def _meta_inputs():
    return [t.to("meta").requires_grad_() for t in _tensors(seqlen_q=256, seqlen_k=256)]


def test_torch_compile_fullgraph_traces_a_call_forward_and_backward_with_no_graph_break():
    def layer(q, k, v):
        out, lse = dropin.flash_attn_func(q, k, v, causal=True, window_size=(64, 0), softcap=30.0, return_lse=True)
        return out.float().sum() + lse.sum()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(*_meta_inputs())
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    q, k, v = _meta_inputs()
    torch.compile(layer, fullgraph=True, backend="aot_eager")(q, k, v).backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


def test_torch_compile_fullgraph_traces_a_packed_call():
    q, k, v = (t[0].to("meta") for t in _tensors(seqlen_q=256, seqlen_k=256))
    cu = torch.tensor([0, 100, 256], dtype=torch.int32, device="meta")

    def layer(q, k, v, cu):
        return dropin.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=156,
                                              max_seqlen_k=156, causal=True)[0]

    torch._dynamo.reset()
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(q, k, v, cu)
    assert out.shape == q.shape


def test_the_op_s_schema_and_fake_implementation_pass_torch_s_own_checks():
    q, k, v = (t.to("meta") for t in _tensors())
    args = (q, k, v, None, None, None, None, None, None, None, None, True, 64, 0, 0.0, 1, None, True)
    torch.library.opcheck(torch.ops.fa4tune.fwd.default, args, test_utils=("test_schema",))
    out, lse = torch.ops.fa4tune.fwd(*args)
    assert out.shape == q.shape and lse.shape == (2, 4, 128)
