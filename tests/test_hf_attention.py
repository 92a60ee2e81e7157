"""fa4tune.hf_attention (issue 69): transformers' attention interface, on the CPU: a random-weight Llama built from a
config gives SDPA's logits when our attention function runs it (the kernel call replaced by SDPA in the drop-in's
layout, so that what is checked is the interface: layouts, causal flag, scaling, window, mask handling)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from fa4tune import dropin, hf_attention  # noqa: E402


def _llama(implementation, **extra):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval().to(torch.float32)


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []

    def fake(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0):
        calls.append(dict(shape=tuple(q.shape), causal=causal, window_size=window_size, softcap=softcap))
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                               is_causal=causal, scale=softmax_scale, enable_gqa=True)
        return out.transpose(1, 2), None

    monkeypatch.setattr(dropin, "flash_attn_func", fake)
    return calls


def test_a_llama_from_a_config_runs_our_attention_and_matches_sdpa(kernel_calls):
    assert hf_attention.register() == "fa4tune"
    ids = torch.randint(0, 128, (2, 48))
    model = _llama("sdpa")
    with torch.no_grad():
        expected = model(ids).logits
        model.set_attn_implementation("fa4tune")
        got = model(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(kernel_calls) == 2 and kernel_calls[0] == dict(shape=(2, 48, 4, 16), causal=True, window_size=(None, None),
                                                             softcap=0.0)


def test_a_padded_batch_runs_sdpa_with_the_padding_masked(kernel_calls):
    hf_attention.register()
    ids, mask = torch.randint(0, 128, (2, 32)), torch.ones(2, 32, dtype=torch.long)
    mask[1, 20:] = 0
    model = _llama("sdpa")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("fa4tune")
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :20], expected[1, :20], atol=1e-5, rtol=1e-5)
    assert kernel_calls == []


def test_a_sliding_window_reaches_the_kernel_as_upstream_s_window_size(kernel_calls):
    query = torch.zeros(1, 4, 64, 16)
    module = torch.nn.Module()
    hf_attention.attention_forward(module, query, query, query, None, sliding_window=16, softcap=50.0, is_causal=True)
    hf_attention.attention_forward(module, query, query, query, None, sliding_window=4096, is_causal=True)
    assert [(c["window_size"], c["softcap"]) for c in kernel_calls] == [((15, 0), 50.0), ((None, None), 0.0)]
