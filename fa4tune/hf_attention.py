"""An attention implementation for Hugging Face transformers (the optional extra `hf`): models run our tuned kernels
through fa4tune.dropin.

    import experiment                                   # the tuned tables (or fa4tune.torch_op.use_tables(...))
    from fa4tune import hf_attention
    hf_attention.register()                             # attn_implementation="fa4tune"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fa4tune")

A call without a padding mask (transformers' flash-attention mask: None when no token is padded) runs
flash_attn_func with the layer's causal flag, scaling, sliding window (transformers' window W: W - 1 keys back, as
its flash-attention integration passes it) and soft-cap; a padded batch runs transformers' SDPA implementation with
the same arguments (a debug line on the "fa4tune" logger says so).
"""

from __future__ import annotations

import logging

import torch

NAME = "fa4tune"
log = logging.getLogger("fa4tune")


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      **kwargs):
    """transformers' attention-interface signature: (batch, heads, seqlen, head_dim) in, (batch, seqlen, heads,
    head_dim) out and no attention weights."""
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if attention_mask is not None or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        from fa4tune.config import ConfigError

        if softcap:
            raise ConfigError("hf_padded_softcap", f"a padded batch with softcap={softcap} runs SDPA, which has no "
                                                   "soft-cap: pass unpadded batches (or attn_implementation='eager')")
        log.debug("fa4tune: transformers' SDPA for %s: %s", type(module).__name__,
                  "a padding mask" if attention_mask is not None else f"dropout {dropout}")
        mask = _sdpa_mask(attention_mask, query, key, causal, sliding_window)
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                      is_causal=causal and mask is None, **kwargs)
    from fa4tune.dropin import flash_attn_func

    windowed = sliding_window is not None and key.shape[2] > sliding_window
    window = (sliding_window - 1, 0 if causal else sliding_window - 1) if windowed else (None, None)
    out, _ = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scaling,
                             causal=causal, window_size=window, softcap=softcap or 0.0)
    return out, None


def _sdpa_mask(padding, query, key, causal, sliding_window=None):
    """transformers' 2-D padding mask (batch, keys; True: a real token) as SDPA's boolean (batch, 1, queries, keys)
    mask, causal bottom-right aligned, with the sliding window."""
    if padding is None:
        return None
    keys = padding[:, None, None, -key.shape[2]:].bool()
    rows = torch.arange(query.shape[2], device=query.device)[:, None] + (key.shape[2] - query.shape[2])
    cols = torch.arange(key.shape[2], device=query.device)[None, :]
    if causal:
        keys = keys & (cols <= rows)
    if sliding_window is not None:
        keys = keys & (cols > rows - sliding_window) & (cols < rows + sliding_window if not causal else True)
    return keys


def register() -> str:
    """Registers attn_implementation "fa4tune" (its mask: transformers' flash-attention one); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, flash_attention_mask)
    return NAME
