"""Sliding window and soft-cap as problem-class dimensions (issue 69): names round-trip, a problem's window and
softcap give its class, only a kernel class that declares the feature serves such a class, and the fallback rule
never hands a window or softcap class an entry of a class without it."""

from __future__ import annotations

import pytest

import experiment
from fa4tune import api, fallback
from fa4tune.config import ConfigError, ForwardConfig, Problem, ProblemClass, is_local
from fa4tune.feasibility import check_backward, check_forward_entry
from fa4tune.targets import get_target


@pytest.mark.parametrize("name", ["d128-causal-gqa4-window-bf16", "d256-causal-gqa2-window-softcap-bf16",
                                  "d128-causal-gqa4-window-decode-bf16", "d64-noncausal-softcap-fp16"])
def test_a_window_or_softcap_class_name_round_trips(name):
    assert ProblemClass.parse(name).name == name


def test_a_plain_class_keeps_its_name():
    assert ProblemClass(128, 128, True, 4).name == "d128-causal-gqa4-bf16"


@pytest.mark.parametrize("causal, left, right, local", [
    (True, -1, -1, False), (True, -1, 0, False), (True, 4096, 0, True), (True, 4096, -1, True),
    (False, -1, -1, False), (False, 128, 128, True), (False, -1, 0, True), (True, None, None, False)])
def test_local_is_upstream_s_rule(causal, left, right, local):
    assert is_local(causal, left, right) is local


def test_a_problem_s_window_and_softcap_give_its_class():
    gemma2 = Problem(1, 8192, 8192, 16, 8, 256, 256, True, window_size_left=4096, window_size_right=0, softcap=50.0)
    assert gemma2.problem_class.name == "d256-causal-gqa2-window-softcap-bf16"
    assert "window (4096, 0) softcap 50" in gemma2.label
    with pytest.raises(ConfigError, match="window_size"):
        Problem(1, 128, 128, 4, 4, 64, 64, True, window_size_left=-2)


@pytest.mark.parametrize("kernel", ["sm120_tma_trimmed", "sm120_splitkv", "sm120_tma"])
def test_only_a_class_that_declares_the_feature_serves_a_window_or_softcap_class(kernel):
    pc = ProblemClass(64, 64, True, window=True, regime="decode" if kernel == "sm120_splitkv" else "prefill")
    extra = {"num_splits": 0} if kernel == "sm120_splitkv" else {}
    config = ForwardConfig(tile_m=64, tile_n=64, num_threads=128, kernel=kernel, extra=extra)
    verdict = check_forward_entry(config, pc, get_target())
    assert not verdict and verdict.rule == "kernel_local"
    assert check_forward_entry(ForwardConfig(tile_m=64, tile_n=64), pc, get_target())
    softcap = ProblemClass(64, 64, True, softcap=True)
    assert check_backward(experiment.BACKWARD_DISPATCH["d64-causal-bf16"], softcap, get_target()).rule == "kernel_softcap"


def test_the_fallback_never_crosses_a_window_or_softcap():
    pc = ProblemClass(128, 128, True, 4, window=True)
    assert all((n.window, n.softcap) == (True, False)
               for n in fallback.neighbours(pc, ["d128-causal-gqa4-bf16", "d128-causal-gqa2-window-bf16"]))
    assert experiment.TABLES.resolution("fwd", pc).rule == "own"  # Mistral's window class: its own study's entry
    # d64 causal has entries of its own and a window class of d64 has none: the windowed call runs upstream's config,
    # never the unwindowed entry (a local mask changes the work)
    d64 = ProblemClass(64, 64, True, window=True)
    assert "d64-causal-bf16" in experiment.FORWARD_DISPATCH
    found = experiment.TABLES.resolution("fwd", d64)
    assert found.rule == "upstream" and experiment.forward_config(d64).kernel == "sm120"
    assert experiment.backward_config(ProblemClass(128, 128, True, 4, softcap=True)).kernel == "sm120"


def test_attention_classes_a_windowed_call_by_its_window():
    import torch

    q = torch.zeros(1, 64, 4, 64, dtype=torch.bfloat16)
    extras = api.Extras(32, 0, 30.0)
    assert api.problem_class_of(q, q, q, True, extras=extras).name == "d64-causal-window-softcap-bf16"
    assert extras.forward_args()["window_size_left"] == 32 and extras.backward_args()["softcap"] == 30.0


def _dense(q, k, v, causal, window_size, softcap):
    """Attention written out whole (one row at a time, keys by their index), fp64."""
    import torch

    b, sq, h, d = q.shape
    sk, g = k.shape[1], h // k.shape[2]
    out = torch.zeros(b, sq, h, v.shape[-1], dtype=torch.float64)
    left, right = window_size
    for i in range(sq):
        diagonal = i + sk - sq
        keys = [j for j in range(sk) if (not causal or j <= diagonal) and (left < 0 or j >= diagonal - left)
                and (right < 0 or j <= diagonal + right)]
        if not keys:
            continue
        for head in range(h):
            s = (q[:, i, head].double()[:, None, :] * k[:, keys, head // g].double()).sum(-1) / d ** 0.5
            s = softcap * torch.tanh(s / softcap) if softcap else s
            out[:, i, head] = (torch.softmax(s, -1)[..., None] * v[:, keys, head // g].double()).sum(1)
    return out


@pytest.mark.parametrize("causal, window_size, softcap, sq, sk", [
    (True, (16, 0), 0.0, 40, 40), (True, (7, -1), 5.0, 24, 56), (False, (5, 3), 0.0, 33, 33),
    (False, (-1, -1), 2.0, 20, 20), (True, (-1, -1), 0.0, 30, 50), (False, (3, 0), 0.0, 40, 20)])
def test_the_gate_s_fp32_reference_applies_the_window_and_the_softcap(causal, window_size, softcap, sq, sk):
    import torch

    from fa4tune.harness import gate

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 16, generator=g) for n, h in ((sq, 4), (sk, 2), (sk, 2)))
    ref = gate.reference_attention(q, k, v, causal, window_size=window_size, softcap=softcap, chunk_bytes=4096)
    torch.testing.assert_close(ref.out.double(), _dense(q, k, v, causal, window_size, softcap), atol=1e-5, rtol=1e-5)
    first, last = gate.key_range(torch.arange(sq), sq, sk, causal, window_size)
    assert torch.equal(ref.valid_rows[0, 0], first <= last)
