"""Upstream's own packed GQA backward on SM120 kernels, without fa4tune: flash_attn.cute.flash_attn_varlen_func,
per-sequence max errors of dQ, dK, dV against an fp32 reference, next to the same sequences run one at a time
(flash_attn_func). Record: docs/measurements/2026-12-05-h100-varlen-gqa-backward.md.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 docs/measurements/data/2026-12-05-varlen-gqa-backward-probe.py
"""

import torch
import torch.nn.functional as F
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func


def reference(q, k, v, causal, dout):
    q, k, v = (t.detach().float().transpose(0, 1).requires_grad_() for t in (q, k, v))  # (h, s, d)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal, enable_gqa=True)[0]
    grads = torch.autograd.grad(out, (q, k, v), dout.float().transpose(0, 1))
    return [g.transpose(0, 1) for g in grads]


def errors(grads, ref):
    return " ".join(f"{n} {(g.float() - r).abs().max().item():7.3f}" for n, g, r in zip(("dq", "dk", "dv"), grads, ref))


torch.manual_seed(0)
CASES = {  # name: (q heads, kv heads, lengths)
    "gqa4, lengths off the 64-row tile": (32, 8, (3072, 1800, 1200, 900, 700, 300, 150, 70)),
    "gqa4, every length a multiple of 128": (32, 8, (1024, 512, 2048, 256)),
    "no gqa, lengths off the tile": (16, 16, (1800, 1200, 900, 70)),
}
for name, (hq, hkv, lengths) in CASES.items():
    total, d = sum(lengths), 128
    q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(q)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
                                 max_seqlen_k=max(lengths), causal=True)
    out = out[0] if isinstance(out, tuple) else out
    packed = torch.autograd.grad(out, (q, k, v), dout)
    print(f"== {name}: hq {hq} hkv {hkv} d {d} causal, lengths {lengths}")
    for i, (s, e) in enumerate(zip(cu.tolist(), cu.tolist()[1:])):
        ref = reference(q[s:e], k[s:e], v[s:e], True, dout[s:e])
        qq, kk, vv = (t[s:e][None].detach().requires_grad_() for t in (q, k, v))
        o1 = flash_attn_func(qq, kk, vv, causal=True)
        o1 = o1[0] if isinstance(o1, tuple) else o1
        single = [g[0] for g in torch.autograd.grad(o1, (qq, kk, vv), dout[s:e][None])]
        print(f"  seq {i} start {s:5d} len {e - s:5d} | packed: {errors([g[s:e] for g in packed], ref)} "
              f"| alone: {errors(single, ref)}")
