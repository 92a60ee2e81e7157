"""bench/gpu_ncu.py: the SDPA reference's causal mask is aligned bottom-right, as upstream's kernels align it."""

from types import SimpleNamespace

from bench import gpu_ncu


def test_the_reference_mask_is_bottom_right():
    mask = gpu_ncu._bottom_right(SimpleNamespace(seqlen_q=2, seqlen_k=4), device="cpu")
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_the_backward_takes_the_dispatch_or_upstream_config_only(capsys):
    import pytest

    with pytest.raises(SystemExit) as done:
        gpu_ncu.main(["--direction", "bwd", "--config", "tma:64x64"])
    assert done.value.code == 2 and "--config for the backward is dispatch or upstream, got 'tma:64x64'" in capsys.readouterr().err


def test_the_backward_profiles_only_gradients_that_match_sdpa(capsys):
    """_backward on the CPU with a stand-in for experiment.attention: SDPA's own gradients pass, gradients off by 10 %
    are refused before any profiled call."""
    import torch
    import torch.nn.functional as F

    from fa4tune.config import Problem

    problem = Problem(1, 64, 64, 4, 2, 32, 32, True, name="tiny gqa causal")
    mask = gpu_ncu._bottom_right(problem, device="cpu")
    calls = []

    def stand_in(scale):
        def attention(q, k, v, causal, bwd_config):
            calls.append(bwd_config)
            out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask, enable_gqa=True).transpose(1, 2)
            return out * scale + out.detach() * (1 - scale)  # the same output, gradients scaled
        return attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 64, h, 32, generator=gen) for h in (4, 2, 2))
    args = SimpleNamespace(config="upstream", calls=2)
    experiment = SimpleNamespace(attention=stand_in(1.0), backward_config=None)
    assert gpu_ncu._backward(experiment, problem, args, q, k, v, mask) == 0 and len(calls) == 3
    assert "relative max error 0 against SDPA; 2 more calls" in capsys.readouterr().out
    calls.clear()
    experiment = SimpleNamespace(attention=stand_in(1.1), backward_config=None)
    assert gpu_ncu._backward(experiment, problem, args, q, k, v, mask) == 1 and len(calls) == 1
    assert "not profiled" in capsys.readouterr().out
