"""bench/gpu_smoke.py's reference (fp32, GQA, causal bottom-right) is attention: checked here on the CPU against SDPA."""

import torch
import torch.nn.functional as F

from bench import gpu_smoke


def test_the_reference_is_attention():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, s, h, 16, generator=gen) for s, h in ((4, 4), (6, 1), (6, 1)))
    for causal in (False, True):
        mask = torch.ones(4, 6, dtype=torch.bool).tril(2) if causal else None
        ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask, enable_gqa=True).transpose(1, 2)
        assert torch.allclose(gpu_smoke.reference(q, k, v, causal), ref, atol=1e-5)
